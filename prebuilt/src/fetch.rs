//! Artifacts that a bundle leaves in its store: where each variant's cubin is, the user's
//! artifact cache, the store client, and prefetch.
//!
//! A slim wheel ships some variants' artifacts and records the store that holds all of them
//! ([`Index::store`]). The loader takes a variant's cubin from the first place that has it:
//!
//! ```text
//! variant V of kernel K (the index gives its digest D and size S)
//!   ├─ <bundle>/artifacts/D[..2]/D.cubin.zst            decompress, check sha256   local (bundle)
//!   ├─ <cache>/cubins-v1/D[..2]/D.cubin                 check sha256 and size      local (cache)
//!   ├─ <PACKAGE>_NO_DOWNLOAD=1                          V does not count: the JIT rules apply
//!   └─ GET <store>/cas/D   timeout, bounded retries with backoff                  remote
//!        sha256 = D and size = S ─► cache (temp file + rename) ─► load
//!        anything else           ─► an error naming the URL, the kernel and the variant;
//!                                   nothing is written, nothing is loaded
//! ```
//!
//! # What the store holds
//!
//! The store speaks the bazel-remote HTTP protocol: `GET`/`HEAD`/`PUT <store>/cas/<sha256>`,
//! where the key is the sha256 of the bytes stored. kwheel stores **the uncompressed cubin**,
//! so its key is the digest the index already records for the variant ([`StoredFile::digest`])
//! and a download is verified against it with nothing else to trust. A bundle's compressed
//! frames depend on the dictionary trained on that bundle, so the same cubin would have another
//! key in every release; the raw cubin has one key for ever, which the shared build cache
//! (`bundler::remote`) uses too, so a cubin built once is stored once. Cubins are small (tens
//! to hundreds of KiB); the transfer is what one device needs, not the whole matrix.
//!
//! # The artifact cache
//!
//! ```text
//! ${KWHEEL_ARTIFACT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwheel/artifacts}/
//! └── cubins-v1/                  layout version (CACHE_LAYOUT): bump when an entry changes
//!     └── 5a/                     first two hex digits of the digest
//!         ├── 5a0d…e1.cubin       the cubin, named by its sha256, renamed into place whole
//!         └── .tmp-XXXXXX         a write in progress (never read as an entry)
//! ```
//!
//! A download is held in memory and verified before anything touches the disk, then written
//! to a temporary file in the entry's directory and renamed into place; an entry is checked
//! against the index again each time it is read, and a damaged one is removed. The cache is
//! never inside site-packages or the bundle. Entry paths come from digests parsed as
//! [`Digest`] (64 lowercase hex digits), so an index cannot make the cache read, write or
//! remove anything but its own entries; no download is larger than
//! [`MAX_ARTIFACT_SIZE`](crate::untrusted::MAX_ARTIFACT_SIZE), whatever a server or an
//! action-cache entry claims.
//!
//! Networking is the cargo feature `fetch` (reqwest with rustls); without it the loader still
//! reads the wheel and the cache, and a variant only the store has is an error that says so.
//! `docs/distribution.md` describes publishing, slim wheels and the CI recipe.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bundle::Bundle;
use crate::index::{StoredFile, Variant};
use crate::key::sha256_hex;
use crate::select::{select_variant, CoverageReport, DeviceQuery};
use crate::untrusted::{read_regular_file, Digest, MAX_ARTIFACT_SIZE};

/// The variable that holds the bearer token sent to stores and remote caches. Tokens are read
/// from the environment only, never from a command line (which other users can read).
pub const STORE_TOKEN_ENV: &str = "KWHEEL_STORE_TOKEN";
/// Overrides where the artifact cache lives.
pub const ARTIFACT_CACHE_ENV: &str = "KWHEEL_ARTIFACT_CACHE";
/// The cache layout's directory name. Bump it when the entry format or the file names change.
pub const CACHE_LAYOUT: &str = "cubins-v1";
/// The bundle's directory inside a kernel library's Python package.
const PREBUILT_DIR: &str = "_prebuilt";

/// The variable that forbids a package's loader to download: `af3-kernels` →
/// `AF3_KERNELS_NO_DOWNLOAD`.
pub fn no_download_variable(package: &str) -> String {
    format!("{}_NO_DOWNLOAD", crate::env::package_prefix(package))
}

/// Whether the loader may download a variant the bundle leaves in its store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DownloadPolicy {
    /// Read `<PACKAGE>_NO_DOWNLOAD`: `1`, `true`, `yes` or `on` forbid downloading; anything
    /// else, or unset, allows it.
    #[default]
    FromEnvironment,
    /// Download what the bundle and the cache lack.
    Allowed,
    /// Never download: a variant that is neither in the bundle nor in the cache does not
    /// count, and the JIT rules apply.
    Forbidden,
}

impl DownloadPolicy {
    /// Whether downloading is allowed, reading `<PACKAGE>_NO_DOWNLOAD` for
    /// [`DownloadPolicy::FromEnvironment`].
    pub fn allows_download(self, package: &str) -> bool {
        match self {
            DownloadPolicy::Allowed => true,
            DownloadPolicy::Forbidden => false,
            DownloadPolicy::FromEnvironment => {
                let value = std::env::var_os(no_download_variable(package));
                !value
                    .as_deref()
                    .and_then(|value| value.to_str())
                    .is_some_and(forbids)
            }
        }
    }
}

fn forbids(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The artifact cache directory: `$KWHEEL_ARTIFACT_CACHE`, else
/// `${XDG_CACHE_HOME:-~/.cache}/kwheel/artifacts`.
pub fn default_cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

fn cache_dir_from(env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    crate::cache_dir_from(env, ARTIFACT_CACHE_ENV, "artifacts")
}

/// How messages name a variant: `` `layernorm_bf16` (cu130/sm_100a) ``.
pub fn describe(kernel: &str, variant: &Variant) -> String {
    format!("`{kernel}` ({})", variant.label())
}

/// A failure to download, verify, upload or cache an artifact. Every message names the URL
/// and what was asked for (a kernel and its variant, a wheel, a cache entry).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The store's URL is not an `http://` or `https://` URL.
    #[error("invalid store URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server answered with a status that is not success (after retrying the transient
    /// ones).
    #[error(
        "cannot {action} {what} at {url}: the server answered {status}{}",
        status_hint(*status, *attempts)
    )]
    Status {
        /// `fetch`, `upload` or `look up`.
        action: &'static str,
        /// What was asked for.
        what: String,
        /// The URL.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// How many requests were made.
        attempts: u32,
    },
    /// No answer: the connection failed, timed out or broke off mid-body, every attempt.
    #[error("cannot {action} {what} at {url} ({attempts} attempts)")]
    Transport {
        /// `fetch`, `upload` or `look up`.
        action: &'static str,
        /// What was asked for.
        what: String,
        /// The URL.
        url: String,
        /// How many requests were made.
        attempts: u32,
        /// The last attempt's failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The bytes served are not the ones asked for.
    #[error(
        "{what} from {url} failed verification: expected sha256 {expected}{}, got {actual} \
         ({actual_size} bytes); nothing was stored or loaded",
        expected_size.map(|size| format!(" ({size} bytes)")).unwrap_or_default()
    )]
    DigestMismatch {
        /// What was asked for.
        what: String,
        /// The URL.
        url: String,
        /// The digest asked for.
        expected: String,
        /// The size the index records, when it does.
        expected_size: Option<u64>,
        /// The digest of what came (of its first `expected_size + 1` bytes at most).
        actual: String,
        /// How many bytes came (read up to one past the expected size).
        actual_size: u64,
    },
    /// What was asked for is unsafe to fetch: a digest that is not a sha256, or a recorded
    /// size over the cap. Nothing was requested.
    #[error("refusing to fetch {what} from {url}: {reason}")]
    Refused {
        /// What was asked for.
        what: String,
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A verified artifact could not be written to the cache.
    #[error("cannot store {what} in the artifact cache at `{}`", path.display())]
    Cache {
        /// What was being stored.
        what: String,
        /// The cache entry.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file to upload could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The artifact is only in the store, and this build has no networking.
    #[error(
        "{what} is not in the bundle and must come from {url}, but this kwheel was built \
         without downloads (the `prebuilt` crate's cargo feature `fetch`)"
    )]
    Unsupported {
        /// What was asked for.
        what: String,
        /// Where it would come from.
        url: String,
    },
    /// The artifact is only in the store, and downloading is forbidden.
    #[error("{what} is only in the store and {variable}=1 forbids downloading it")]
    Forbidden {
        /// What was asked for.
        what: String,
        /// The variable that forbids it: `AF3_KERNELS_NO_DOWNLOAD`.
        variable: String,
    },
    /// The artifact is in neither the bundle nor the cache, and the bundle records no store.
    #[error(
        "{what} is missing from the bundle (`{}`) and the bundle records no store to fetch it \
         from: rebuild the wheel",
        path.display()
    )]
    NoStore {
        /// What was asked for.
        what: String,
        /// The file the index names.
        path: PathBuf,
    },
    /// No bundle was found for a package name.
    #[error(
        "no installed package `{package}` with a `_prebuilt/` bundle in {}; give the bundle \
         directory instead",
        searched_list(searched)
    )]
    PackageNotFound {
        /// The name given.
        package: String,
        /// The site-packages directories searched.
        searched: Vec<PathBuf>,
    },
}

fn status_hint(status: u16, attempts: u32) -> String {
    let mut hint = String::new();
    if attempts > 1 {
        hint.push_str(&format!(" ({attempts} attempts)"));
    }
    match status {
        401 | 403 => hint.push_str(&format!(
            "; set {STORE_TOKEN_ENV} to a token the store accepts"
        )),
        404 => hint.push_str("; the store does not have it (was the release published?)"),
        507 => hint.push_str("; the store is out of space"),
        _ => {}
    }
    hint
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

/// Where a variant's cubin is, as seen from this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactLocation {
    /// In the bundle (the wheel).
    Bundle,
    /// In the user's artifact cache (fetched before).
    Cache,
    /// Only in the store: fetched on first load.
    Store,
    /// Nowhere: the bundle lacks it and records no store.
    Missing,
}

impl ArtifactLocation {
    /// Whether loading it needs no network.
    pub fn is_local(self) -> bool {
        matches!(self, ArtifactLocation::Bundle | ArtifactLocation::Cache)
    }
}

impl fmt::Display for ArtifactLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArtifactLocation::Bundle => "local (bundle)",
            ArtifactLocation::Cache => "local (cache)",
            ArtifactLocation::Store => "remote",
            ArtifactLocation::Missing => "missing",
        })
    }
}

/// The user's cache of verified cubins, by digest (layout in the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactCache {
    root: PathBuf,
}

impl Default for ArtifactCache {
    /// The cache at [`default_cache_dir`].
    fn default() -> Self {
        ArtifactCache::new(default_cache_dir())
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
    /// (a regular file of the cache whose bytes do not match) is removed and reads as absent.
    pub fn read(&self, stored: &StoredFile) -> Option<Vec<u8>> {
        let path = self.entry_path(&stored.digest)?;
        let metadata = std::fs::symlink_metadata(&path).ok()?;
        if !metadata.is_file() {
            return None;
        }
        let bytes = read_regular_file(&path, stored.size.min(MAX_ARTIFACT_SIZE)).ok();
        match bytes {
            Some(bytes)
                if bytes.len() as u64 == stored.size && sha256_hex(&bytes) == stored.digest =>
            {
                Some(bytes)
            }
            _ => {
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores verified `bytes` under `digest`: a temporary file in the entry's directory,
    /// renamed into place. `what` names the artifact in errors.
    pub fn write(&self, digest: &str, bytes: &[u8], what: &str) -> Result<PathBuf, FetchError> {
        let parsed = Digest::parse(digest).map_err(|refusal| FetchError::Cache {
            what: what.to_owned(),
            path: self.root.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, refusal),
        })?;
        let path = self.entry_path_of(&parsed);
        let error = |source| FetchError::Cache {
            what: what.to_owned(),
            path: path.clone(),
            source,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(error)?;
        let mut file = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempfile_in(dir)
            .map_err(error)?;
        file.write_all(bytes).map_err(error)?;
        file.as_file().sync_all().map_err(error)?;
        file.persist(&path)
            .map_err(|persist| error(persist.error))?;
        Ok(path)
    }
}

/// Where `variant`'s cubin is: the bundle, the cache, the store, or nowhere. Looks at file
/// presence and sizes only; reading verifies.
pub fn locate(bundle: &Bundle, variant: &Variant, cache: &ArtifactCache) -> ArtifactLocation {
    if bundle.root().join(&variant.artifact.path).is_file() {
        ArtifactLocation::Bundle
    } else if cache.contains(&variant.artifact) {
        ArtifactLocation::Cache
    } else if bundle.index().store.is_some() {
        ArtifactLocation::Store
    } else {
        ArtifactLocation::Missing
    }
}

/// Timeouts, retries and credentials for talking to a store.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time for a whole request of up to 1 MiB; larger bodies get one more second per MiB.
    pub timeout: Duration,
    /// Requests per operation, the first included (at least 1). Connection failures,
    /// timeouts, bodies cut short, and 408, 429, 500, 502, 503, 504 are retried.
    pub attempts: u32,
    /// The wait before the second attempt; it doubles before each further one (at most 8 s).
    pub backoff: Duration,
    /// The bearer token, if the store wants one ([`STORE_TOKEN_ENV`]).
    pub token: Option<String>,
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for StoreOptions {
    /// 10 s to connect, 30 s a request, 4 attempts from 250 ms apart, the token from
    /// [`STORE_TOKEN_ENV`].
    fn default() -> Self {
        StoreOptions {
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            attempts: 4,
            backoff: Duration::from_millis(250),
            token: std::env::var(STORE_TOKEN_ENV)
                .ok()
                .filter(|token| !token.trim().is_empty()),
        }
    }
}

impl StoreOptions {
    /// The wait before attempt `attempt` (2, 3, …).
    pub fn backoff_before(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(2).min(16);
        self.backoff
            .saturating_mul(1 << doublings)
            .min(Duration::from_secs(8))
    }

    /// The whole-request timeout for a body of `size` bytes.
    pub fn timeout_for(&self, size: u64) -> Duration {
        self.timeout + Duration::from_secs(size / (1 << 20))
    }
}

/// Checks that `url` is an `http://` or `https://` URL and returns it without trailing `/`.
pub fn normalize_store_url(url: &str) -> Result<String, FetchError> {
    let trimmed = url.trim().trim_end_matches('/');
    let invalid = |reason: &str| FetchError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(|| invalid("it must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(invalid("it has no host"));
    }
    if rest.contains(['?', '#']) {
        return Err(invalid("it must not have a query or a fragment"));
    }
    if rest
        .split('/')
        .next()
        .is_some_and(|host| host.contains('@'))
    {
        return Err(invalid(&format!(
            "credentials do not belong in a URL: set {STORE_TOKEN_ENV}"
        )));
    }
    Ok(trimmed.to_owned())
}

#[cfg(feature = "fetch")]
pub use client::Store;

#[cfg(feature = "fetch")]
mod client {
    use std::io::Read as _;

    use reqwest::blocking::{Client, RequestBuilder, Response};
    use reqwest::StatusCode;

    use super::*;

    /// A store speaking the bazel-remote HTTP protocol (`/cas/<sha256>`, `/ac/<key>`).
    #[derive(Clone, Debug)]
    pub struct Store {
        base: String,
        client: Client,
        options: StoreOptions,
    }

    /// One request's outcome, before the caller decides what it means.
    enum Answer {
        Body(Vec<u8>),
        Status(u16),
    }

    impl Store {
        /// A client for the store at `url` (`https://cache.example.com`, or with a path prefix
        /// such as `https://cache.example.com/instance`).
        pub fn new(url: &str, options: StoreOptions) -> Result<Store, FetchError> {
            let base = normalize_store_url(url)?;
            let client = Client::builder()
                .connect_timeout(options.connect_timeout)
                .timeout(options.timeout)
                .user_agent(concat!("kwheel/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|error| FetchError::InvalidUrl {
                    url: url.to_owned(),
                    reason: format!("cannot set up an HTTP client: {error}"),
                })?;
            Ok(Store {
                base,
                client,
                options,
            })
        }

        /// The store's base URL, without trailing `/`.
        pub fn url(&self) -> &str {
            &self.base
        }

        /// `<store>/cas/<digest>`.
        pub fn cas_url(&self, digest: &str) -> String {
            format!("{}/cas/{digest}", self.base)
        }

        /// `<store>/ac/<key>`.
        pub fn ac_url(&self, key: &str) -> String {
            format!("{}/ac/{key}", self.base)
        }

        /// The bytes with sha256 `digest` (and `size`, when known), verified; `None` when the
        /// store does not have them (404). `what` names them in errors.
        pub fn get_cas(
            &self,
            digest: &str,
            size: Option<u64>,
            what: &str,
        ) -> Result<Option<Vec<u8>>, FetchError> {
            let url = self.cas_url(digest);
            let refused = |reason: String| FetchError::Refused {
                what: what.to_owned(),
                url: url.clone(),
                reason,
            };
            Digest::parse(digest).map_err(|refusal| refused(refusal.to_string()))?;
            if let Some(size) = size.filter(|&size| size > MAX_ARTIFACT_SIZE) {
                return Err(refused(format!(
                    "its recorded size, {size} bytes, is over the {MAX_ARTIFACT_SIZE}-byte cap"
                )));
            }
            // One byte past the recorded size (or the cap) is enough to tell "too long" from
            // "right".
            let limit = size.unwrap_or(MAX_ARTIFACT_SIZE).saturating_add(1);
            let timeout = self.options.timeout_for(size.unwrap_or(0));
            let bytes = match self.get(&url, limit, timeout, None, what)? {
                Some(bytes) => bytes,
                None => return Ok(None),
            };
            let actual = sha256_hex(&bytes);
            let size_matches = size.is_none_or(|size| size == bytes.len() as u64);
            if actual != digest || !size_matches {
                return Err(FetchError::DigestMismatch {
                    what: what.to_owned(),
                    url,
                    expected: digest.to_owned(),
                    expected_size: size,
                    actual,
                    actual_size: bytes.len() as u64,
                });
            }
            Ok(Some(bytes))
        }

        /// The action-cache entry under `key` (at most 1 MiB); `None` when absent. Action
        /// entries are not content-addressed: the caller checks what they point to.
        pub fn get_ac(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>, FetchError> {
            let url = self.ac_url(key);
            // bazel-remote answers with the JSON form of the entry when asked for it.
            let json = Some("application/json");
            self.get(&url, 1 << 20, self.options.timeout, json, what)
        }

        /// Whether the store has the bytes with sha256 `digest` (`HEAD`).
        pub fn contains_cas(&self, digest: &str, what: &str) -> Result<bool, FetchError> {
            let url = self.cas_url(digest);
            match self.send("look up", &url, what, || self.client.head(&url), 0)? {
                (Answer::Body(_), _) => Ok(true),
                (Answer::Status(404), _) => Ok(false),
                (Answer::Status(status), attempts) => Err(FetchError::Status {
                    action: "look up",
                    what: what.to_owned(),
                    url,
                    status,
                    attempts,
                }),
            }
        }

        /// Uploads `bytes` under their sha256 `digest` (`PUT`).
        pub fn put_cas(&self, digest: &str, bytes: &[u8], what: &str) -> Result<(), FetchError> {
            let url = self.cas_url(digest);
            self.put(&url, bytes, "application/octet-stream", what)
        }

        /// Uploads an action-cache entry under `key` (JSON, as bazel-remote accepts an
        /// `ActionResult`).
        pub fn put_ac(&self, key: &str, bytes: &[u8], what: &str) -> Result<(), FetchError> {
            let url = self.ac_url(key);
            self.put(&url, bytes, "application/json", what)
        }

        fn put(
            &self,
            url: &str,
            bytes: &[u8],
            content_type: &str,
            what: &str,
        ) -> Result<(), FetchError> {
            let timeout = self.options.timeout_for(bytes.len() as u64);
            let build = || {
                self.client
                    .put(url)
                    .timeout(timeout)
                    .header(reqwest::header::CONTENT_TYPE, content_type)
                    .body(bytes.to_vec())
            };
            match self.send("upload", url, what, build, 0)? {
                (Answer::Body(_), _) => Ok(()),
                (Answer::Status(status), attempts) => Err(FetchError::Status {
                    action: "upload",
                    what: what.to_owned(),
                    url: url.to_owned(),
                    status,
                    attempts,
                }),
            }
        }

        fn get(
            &self,
            url: &str,
            limit: u64,
            timeout: Duration,
            accept: Option<&str>,
            what: &str,
        ) -> Result<Option<Vec<u8>>, FetchError> {
            let build = || {
                let request = self.client.get(url).timeout(timeout);
                match accept {
                    Some(accept) => request.header(reqwest::header::ACCEPT, accept),
                    None => request,
                }
            };
            match self.send("fetch", url, what, build, limit)? {
                (Answer::Body(bytes), _) => Ok(Some(bytes)),
                (Answer::Status(404), _) => Ok(None),
                (Answer::Status(status), attempts) => Err(FetchError::Status {
                    action: "fetch",
                    what: what.to_owned(),
                    url: url.to_owned(),
                    status,
                    attempts,
                }),
            }
        }

        /// Sends the request `build` makes, retrying transient failures with backoff, and
        /// reads a successful body (at most `limit` bytes; `0` reads none). Returns the answer
        /// and the number of requests made.
        fn send(
            &self,
            action: &'static str,
            url: &str,
            what: &str,
            build: impl Fn() -> RequestBuilder,
            limit: u64,
        ) -> Result<(Answer, u32), FetchError> {
            let attempts = self.options.attempts.max(1);
            let mut attempt = 1;
            loop {
                let mut request = build();
                if let Some(token) = &self.options.token {
                    request = request.bearer_auth(token);
                }
                let outcome = request
                    .send()
                    .map_err(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>)
                    .and_then(|response| read_answer(response, limit));
                let retry = match &outcome {
                    Ok(Answer::Status(status)) => transient(*status),
                    Ok(Answer::Body(_)) => false,
                    Err(_) => true,
                };
                if !retry || attempt >= attempts {
                    return match outcome {
                        Ok(answer) => Ok((answer, attempt)),
                        Err(source) => Err(FetchError::Transport {
                            action,
                            what: what.to_owned(),
                            url: url.to_owned(),
                            attempts: attempt,
                            source,
                        }),
                    };
                }
                attempt += 1;
                std::thread::sleep(self.options.backoff_before(attempt));
            }
        }
    }

    /// Statuses worth asking again.
    fn transient(status: u16) -> bool {
        matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
    }

    fn read_answer(
        response: Response,
        limit: u64,
    ) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
        let status = response.status();
        if !status.is_success() {
            return Ok(Answer::Status(status.as_u16()));
        }
        if limit == 0 || status == StatusCode::NO_CONTENT {
            return Ok(Answer::Body(Vec::new()));
        }
        // Never hold more than `limit` bytes, whatever the server declares or sends: the
        // caller's digest check turns "too long" into a mismatch.
        let declared = response.content_length();
        let mut bytes = Vec::with_capacity(
            declared
                .unwrap_or(0)
                .min(limit)
                .min(64 << 20)
                .try_into()
                .unwrap_or(0),
        );
        response.take(limit).read_to_end(&mut bytes)?;
        if let Some(declared) = declared {
            if declared > bytes.len() as u64 && (bytes.len() as u64) < limit {
                return Err(
                    format!("the body ended after {} of {declared} bytes", bytes.len()).into(),
                );
            }
        }
        Ok(Answer::Body(bytes))
    }
}

/// The cubin of `variant` of `kernel`, which the bundle does not have: from the cache, else
/// (when `download` allows) from the bundle's store, verified and then cached. `store` is
/// made on first need.
#[cfg_attr(not(feature = "fetch"), allow(unused_variables))]
pub fn obtain_remote(
    bundle: &Bundle,
    kernel: &str,
    variant: &Variant,
    cache: &ArtifactCache,
    store: &dyn Fn() -> Result<StoreHandle, FetchError>,
) -> Result<(Vec<u8>, ArtifactLocation), FetchError> {
    if let Some(bytes) = cache.read(&variant.artifact) {
        return Ok((bytes, ArtifactLocation::Cache));
    }
    let what = describe(kernel, variant);
    let Some(url) = &bundle.index().store else {
        return Err(FetchError::NoStore {
            what,
            path: bundle.root().join(&variant.artifact.path),
        });
    };
    #[cfg(feature = "fetch")]
    {
        let _ = url;
        let handle = store()?;
        let bytes = handle
            .store
            .get_cas(&variant.artifact.digest, Some(variant.artifact.size), &what)?
            .ok_or_else(|| FetchError::Status {
                action: "fetch",
                what: what.clone(),
                url: handle.store.cas_url(&variant.artifact.digest),
                status: 404,
                attempts: 1,
            })?;
        cache.write(&variant.artifact.digest, &bytes, &what)?;
        Ok((bytes, ArtifactLocation::Store))
    }
    #[cfg(not(feature = "fetch"))]
    {
        Err(FetchError::Unsupported {
            what,
            url: format!("{url}/cas/{}", variant.artifact.digest),
        })
    }
}

/// A store client, or nothing in a build without the `fetch` feature: what
/// [`obtain_remote`] downloads with.
#[derive(Clone, Debug)]
pub struct StoreHandle {
    #[cfg(feature = "fetch")]
    store: Store,
}

impl StoreHandle {
    /// A client for `url`; without the `fetch` feature, an [`FetchError::Unsupported`] error.
    pub fn connect(url: &str, options: &StoreOptions) -> Result<StoreHandle, FetchError> {
        #[cfg(feature = "fetch")]
        {
            Store::new(url, options.clone()).map(|store| StoreHandle { store })
        }
        #[cfg(not(feature = "fetch"))]
        {
            let _ = options;
            Err(FetchError::Unsupported {
                what: "an artifact".to_owned(),
                url: url.to_owned(),
            })
        }
    }
}

/// What [`prefetch`] did for one kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Prefetched {
    /// The variant that would load is in the bundle.
    InBundle {
        /// Its label, `cu130/sm_100a`.
        variant: String,
    },
    /// It was in the cache already (verified).
    Cached {
        /// Its label.
        variant: String,
    },
    /// It was downloaded, verified and cached.
    Fetched {
        /// Its label.
        variant: String,
        /// Bytes downloaded.
        bytes: u64,
    },
    /// No variant fits the device: nothing to fetch (the JIT rules apply there).
    NothingFits {
        /// Why, per variant.
        reason: String,
    },
    /// Downloading or verifying failed; nothing was cached.
    Failed {
        /// Its label.
        variant: String,
        /// The error and its causes.
        error: String,
    },
}

/// What [`prefetch`] did, per kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrefetchReport {
    /// The bundle's store, if it records one.
    pub store: Option<String>,
    /// The cache the artifacts went to.
    pub cache: PathBuf,
    /// The device asked about, `10.0`.
    pub device: String,
    /// The CUDA build asked about, `cu130`.
    pub cuda: String,
    /// Every kernel of the index.
    pub kernels: BTreeMap<String, Prefetched>,
}

impl PrefetchReport {
    /// Whether every kernel that has a fitting variant now has it locally.
    pub fn complete(&self) -> bool {
        !self
            .kernels
            .values()
            .any(|outcome| matches!(outcome, Prefetched::Failed { .. }))
    }
}

impl fmt::Display for PrefetchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "device {}, CUDA build {}, store {}, cache {}",
            self.device,
            self.cuda,
            self.store.as_deref().unwrap_or("none"),
            self.cache.display()
        )?;
        let width = self.kernels.keys().map(String::len).max().unwrap_or(0);
        for (kernel, outcome) in &self.kernels {
            let line = match outcome {
                Prefetched::InBundle { variant } => format!("{variant}  in the wheel"),
                Prefetched::Cached { variant } => format!("{variant}  cached already"),
                Prefetched::Fetched { variant, bytes } => {
                    format!("{variant}  fetched ({bytes} bytes), verified, cached")
                }
                Prefetched::NothingFits { reason } => format!("none  {reason}"),
                Prefetched::Failed { variant, error } => format!("{variant}  FAILED: {error}"),
            };
            writeln!(f, "{kernel:width$}  {line}")?;
        }
        Ok(())
    }
}

/// Makes sure the cubin each kernel would load on the device `query` describes is local:
/// downloads what the bundle and the cache lack from the bundle's store, verifies it and
/// caches it. For machines that go offline. An explicit request: `<PACKAGE>_NO_DOWNLOAD`
/// governs the loader, not this.
pub fn prefetch(
    bundle: &Bundle,
    query: &DeviceQuery,
    cache: &ArtifactCache,
    options: &StoreOptions,
) -> Result<PrefetchReport, FetchError> {
    let store = std::cell::OnceCell::new();
    let connect = || -> Result<StoreHandle, FetchError> {
        if let Some(handle) = store.get() {
            return Ok(StoreHandle::clone(handle));
        }
        let url = bundle.index().store.as_deref().unwrap_or_default();
        let handle = StoreHandle::connect(url, options)?;
        Ok(store.get_or_init(|| handle).clone())
    };
    let mut kernels = BTreeMap::new();
    for (name, record) in &bundle.index().kernels {
        let outcome = match select_variant(name, record, query) {
            Err(no_fit) => Prefetched::NothingFits {
                reason: no_fit
                    .refusals
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            },
            Ok(choice) => {
                let variant = choice.variant.label();
                match locate(bundle, choice.variant, cache) {
                    ArtifactLocation::Bundle => Prefetched::InBundle { variant },
                    _ => match obtain_remote(bundle, name, choice.variant, cache, &connect) {
                        Ok((_, ArtifactLocation::Cache)) => Prefetched::Cached { variant },
                        Ok((bytes, _)) => Prefetched::Fetched {
                            variant,
                            bytes: bytes.len() as u64,
                        },
                        Err(error) => Prefetched::Failed {
                            variant,
                            error: error_chain(&error),
                        },
                    },
                }
            }
        };
        kernels.insert(name.clone(), outcome);
    }
    Ok(PrefetchReport {
        store: bundle.index().store.clone(),
        cache: cache.dir().to_path_buf(),
        device: query.device(),
        cuda: query.cuda.to_string(),
        kernels,
    })
}

/// `dev coverage` on a bundle on disk: [`crate::select::coverage`] with, for each kernel
/// that loads, where its cubin is (the wheel, the artifact cache, or only the store).
pub fn coverage(bundle: &Bundle, query: &DeviceQuery, cache: &ArtifactCache) -> CoverageReport {
    let mut report = crate::select::coverage(bundle.index(), query);
    for (name, kernel) in &mut report.kernels {
        let Some(label) = &kernel.loads else { continue };
        let variant = bundle.index().kernels[name]
            .variants
            .iter()
            .find(|variant| &variant.label() == label);
        kernel.location = variant.map(|variant| locate(bundle, variant, cache));
    }
    report
}

pub use crate::error_chain;

/// The bundle to prefetch for: a bundle directory (with `index.json`), a package directory
/// (with `_prebuilt/index.json`), or the name of an installed package, looked up in the
/// site-packages of `$KWHEEL_SITE_PACKAGES`, `$VIRTUAL_ENV`, `$CONDA_PREFIX` and
/// `python3`'s own.
pub fn find_bundle(package_or_path: &str) -> Result<PathBuf, FetchError> {
    let path = Path::new(package_or_path);
    for candidate in [path.to_path_buf(), path.join(PREBUILT_DIR)] {
        if candidate.join(crate::bundle::INDEX_FILE).is_file() {
            return Ok(candidate);
        }
    }
    let searched = site_packages();
    let wanted = normalize_package(package_or_path);
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
            if normalize_package(&opened.index().package) == wanted {
                return Ok(bundle);
            }
        }
    }
    Err(FetchError::PackageNotFound {
        package: package_or_path.to_owned(),
        searched,
    })
}

/// PEP 503 normalization: lowercase, runs of `-`, `_`, `.` become one `-`.
fn normalize_package(name: &str) -> String {
    let mut out = String::new();
    let mut separator = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            separator = true;
            continue;
        }
        if separator && !out.is_empty() {
            out.push('-');
        }
        separator = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn site_packages() -> Vec<PathBuf> {
    let mut found = crate::jit::CompilerSearch::from_env().site_packages;
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let script = "import site, sys\n\
                  paths = list(getattr(site, 'getsitepackages', lambda: [])())\n\
                  paths.append(site.getusersitepackages())\n\
                  paths.extend(p for p in sys.path if p.endswith('-packages'))\n\
                  print('\\n'.join(paths))";
    if let Ok(output) = std::process::Command::new(python)
        .args(["-c", script])
        .stderr(std::process::Stdio::null())
        .output()
    {
        if output.status.success() {
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                let path = PathBuf::from(line.trim());
                if !line.trim().is_empty() && path.is_dir() {
                    found.push(path);
                }
            }
        }
    }
    let mut unique = Vec::new();
    for path in found {
        if !unique.contains(&path) {
            unique.push(path);
        }
    }
    unique
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_follows_the_package_name() {
        assert_eq!(
            no_download_variable("af3-kernels"),
            "AF3_KERNELS_NO_DOWNLOAD"
        );
        assert!(forbids("1") && forbids(" TRUE ") && forbids("on"));
        assert!(!forbids("0") && !forbids("") && !forbids("no"));
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
            cache_dir_from(env(&[("KWHEEL_ARTIFACT_CACHE", "/a"), ("HOME", "/h")])),
            PathBuf::from("/a")
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/kwheel/artifacts")
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            PathBuf::from("/h/.cache/kwheel/artifacts")
        );
    }

    #[test]
    fn store_urls_are_checked() {
        assert_eq!(
            normalize_store_url("https://cache.example.com/kernels/").unwrap(),
            "https://cache.example.com/kernels"
        );
        for bad in [
            "cache.example.com",
            "ftp://cache.example.com",
            "https://",
            "https://user:secret@cache.example.com",
            "https://cache.example.com/?x=1",
        ] {
            assert!(normalize_store_url(bad).is_err(), "{bad}");
        }
        let error = normalize_store_url("https://user:secret@cache.example.com").unwrap_err();
        assert!(error.to_string().contains(STORE_TOKEN_ENV), "{error}");
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let options = StoreOptions {
            backoff: Duration::from_millis(100),
            ..StoreOptions::default()
        };
        assert_eq!(options.backoff_before(2), Duration::from_millis(100));
        assert_eq!(options.backoff_before(3), Duration::from_millis(200));
        assert_eq!(options.backoff_before(4), Duration::from_millis(400));
        assert_eq!(options.backoff_before(40), Duration::from_secs(8));
    }

    #[test]
    fn tokens_are_not_printed() {
        let options = StoreOptions {
            token: Some("secret".into()),
            ..StoreOptions::default()
        };
        assert!(!format!("{options:?}").contains("secret"));
    }

    #[test]
    fn package_names_are_normalized() {
        assert_eq!(normalize_package("AF3_Kernels"), "af3-kernels");
        assert_eq!(normalize_package("af3.-kernels"), "af3-kernels");
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
        };
        let path = cache.write(&stored.digest, &bytes, "test").unwrap();
        assert_eq!(cache.read(&stored), Some(bytes));
        std::fs::write(&path, b"cubin bytez").unwrap();
        assert!(cache.contains(&stored));
        assert_eq!(cache.read(&stored), None);
        assert!(!path.exists());
    }
}
