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
//!         └── .5a0d…e1.cubin.<pid>.<random>.tmp  a write in progress (never read as an entry)
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
//! An index is untrusted too: a digest names one content, so an entry whose bytes match its
//! digest is never removed because an index records another size for it. That index's claim
//! is refused instead ([`FetchError::Refused`]) and the entry stays for the packages it belongs
//! to.
//!
//! # Deadlines
//!
//! Each request has its timeout and a bounded number of retries ([`StoreOptions`]); a whole
//! `kwheel fetch` ([`prefetch`]) also has one overall deadline, [`DEFAULT_FETCH_DEADLINE`]
//! unless [`FETCH_DEADLINE_ENV`] gives another number of seconds. Every request and every wait
//! between retries ends by it, so a slow store costs the deadline, not a timeout per kernel;
//! what is left undone is reported as a network failure (exit code 6).
//!
//! Networking is the cargo feature `fetch` (reqwest with rustls); without it the loader still
//! reads the wheel and the cache, and a variant only the store has is an error that says so.
//! `docs/distribution.md` describes publishing, slim wheels and the CI recipe.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bundle::locate;
use crate::bundle::Bundle;
use crate::cache::ArtifactCache;
use crate::device::DeviceQuery;
use crate::env::STORE_TOKEN_ENV;
use crate::error_chain;
use crate::index::ArtifactLocation;
use crate::index::{StoredFile, Variant};
use crate::key::sha256_hex;
use crate::select::select_variant;
use crate::untrusted::{read_regular_file, MAX_ARTIFACT_SIZE};

/// Overrides the overall deadline of one `kwheel fetch`, in seconds.
pub const FETCH_DEADLINE_ENV: &str = "KWHEEL_FETCH_DEADLINE";
/// The overall deadline of one `kwheel fetch` when [`FETCH_DEADLINE_ENV`] is unset.
pub const DEFAULT_FETCH_DEADLINE: Duration = Duration::from_secs(300);

/// The overall deadline of one `kwheel fetch`: [`FETCH_DEADLINE_ENV`] seconds (a positive
/// number, fractions allowed), else [`DEFAULT_FETCH_DEADLINE`].
pub fn fetch_deadline() -> Result<Duration, FetchError> {
    let Ok(value) = std::env::var(FETCH_DEADLINE_ENV) else {
        return Ok(DEFAULT_FETCH_DEADLINE);
    };
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|seconds| seconds.is_finite() && *seconds > 0.0 && *seconds < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or(FetchError::Setting {
            variable: FETCH_DEADLINE_ENV,
            value,
        })
}

/// The deadline a client works to: when it passes, and what it was, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When it passes.
    pub at: Instant,
    /// How long it was when set.
    pub total: Duration,
}

impl Deadline {
    /// A deadline `total` from now.
    pub fn after(total: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    /// The time left, zero once it passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// What a request that ran out of time says.
    pub fn passed(&self) -> String {
        format!(
            "the fetch's overall deadline of {:.1} s passed (set {FETCH_DEADLINE_ENV} to allow more)",
            self.total.as_secs_f64()
        )
    }
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
    /// A setting from the environment is not valid.
    #[error("{variable}=`{value}` is not a number of seconds greater than 0")]
    Setting {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// Some of what a `kwheel fetch` was asked for is not local now.
    #[error("{failed} of {kernels} kernels could not be fetched: {}", crate::untrusted::listed_names(.names))]
    Incomplete {
        /// How many kernels failed.
        failed: usize,
        /// How many the bundle has.
        kernels: usize,
        /// The kernels that failed.
        names: Vec<String>,
        /// What kind of failure: bytes that did not verify if any did not, else a network
        /// failure if any was one.
        cause: FailureCause,
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
}

/// The kind of a [`FetchError`], for exit codes and `kwheel fetch --json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureCause {
    /// Anything else: a setting, the cache, a build without downloads.
    Other,
    /// The store could not be reached, answered an error, or ran past the deadline.
    Network,
    /// What came, or what the index claims, did not verify: nothing was stored or loaded.
    Verification,
}

impl FetchError {
    /// What kind of failure this is.
    pub fn cause(&self) -> FailureCause {
        match self {
            FetchError::Status { .. } | FetchError::Transport { .. } => FailureCause::Network,
            FetchError::DigestMismatch { .. } | FetchError::Refused { .. } => {
                FailureCause::Verification
            }
            FetchError::Incomplete { cause, .. } => *cause,
            _ => FailureCause::Other,
        }
    }
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
mod client;
#[cfg(all(feature = "fetch", feature = "upload"))]
mod upload;

/// Where the loader gets an artifact only the store has: the bytes with sha256 `digest`, or
/// `None` when the store does not have them. The loader verifies what it is given whatever
/// the implementation does, so a store (or a fake of one) cannot make it load other bytes.
pub trait ArtifactStore: Send + Sync {
    /// The bytes with sha256 `digest` (`size` bytes, when known); `what` names them in errors.
    fn get_cas(
        &self,
        digest: &str,
        size: Option<u64>,
        what: &str,
    ) -> Result<Option<Vec<u8>>, FetchError>;

    /// Where the bytes with sha256 `digest` are, for messages: `<store>/cas/<digest>`.
    fn cas_url(&self, digest: &str) -> String;
}

/// The cubin of `variant` of `kernel`, which the bundle does not have: from the cache, else
/// (when `download` allows) from the bundle's store, verified and then cached. `store` is
/// made on first need.
#[cfg_attr(not(feature = "fetch"), allow(unused_variables))]
pub fn obtain_remote(
    root: &Path,
    store_url: Option<&str>,
    kernel: &str,
    variant: &Variant,
    cache: &ArtifactCache,
    store: &dyn Fn() -> Result<StoreHandle, FetchError>,
) -> Result<(Vec<u8>, ArtifactLocation), FetchError> {
    let what = describe(kernel, variant);
    if let Some(actual) = cached_at_other_size(cache, &variant.artifact) {
        return Err(FetchError::Refused {
            what,
            url: store_url.unwrap_or("the bundle").to_owned(),
            reason: format!(
                "the index records {} bytes for sha256 {}, but the artifact cache holds that                  digest's content, verified, at {actual} bytes; the index's claim is refused                  and the cached cubin is kept",
                variant.artifact.size, variant.artifact.digest
            ),
        });
    }
    if let Some(bytes) = cache.read(&variant.artifact) {
        return Ok((bytes, ArtifactLocation::Cache));
    }
    let Some(url) = store_url else {
        return Err(FetchError::NoStore {
            what,
            path: root.join(&variant.artifact.path),
        });
    };
    let _ = url;
    let handle = store()?;
    let digest = &variant.artifact.digest;
    let bytes = handle
        .store
        .get_cas(digest, Some(variant.artifact.size), &what)?
        .ok_or_else(|| FetchError::Status {
            action: "fetch",
            what: what.clone(),
            url: handle.store.cas_url(digest),
            status: 404,
            attempts: 1,
        })?;
    let actual = sha256_hex(&bytes);
    if actual != *digest || bytes.len() as u64 != variant.artifact.size {
        return Err(FetchError::DigestMismatch {
            what,
            url: handle.store.cas_url(digest),
            expected: digest.clone(),
            expected_size: Some(variant.artifact.size),
            actual,
            actual_size: bytes.len() as u64,
        });
    }
    cache
        .write(digest, &bytes)
        .map_err(|source| FetchError::Cache {
            what: what.clone(),
            path: cache
                .entry_path(digest)
                .unwrap_or_else(|| cache.dir().to_owned()),
            source,
        })?;
    Ok((bytes, ArtifactLocation::Store))
}

/// The size of the cache's entry for `stored`'s digest when it is not the size `stored` records
/// but its content does have that digest: a valid entry, and an index that is wrong about it.
fn cached_at_other_size(cache: &ArtifactCache, stored: &StoredFile) -> Option<u64> {
    let path = cache.entry_path(&stored.digest)?;
    let metadata = std::fs::symlink_metadata(&path).ok()?;
    if !metadata.is_file() || metadata.len() == stored.size {
        return None;
    }
    let bytes = read_regular_file(&path, MAX_ARTIFACT_SIZE).ok()?;
    (sha256_hex(&bytes) == stored.digest).then_some(bytes.len() as u64)
}

/// The store [`obtain_remote`] downloads from: an HTTP client ([`StoreHandle::connect`], with
/// the `fetch` feature) or any other [`ArtifactStore`].
#[derive(Clone)]
pub struct StoreHandle {
    store: Arc<dyn ArtifactStore>,
}

impl fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreHandle").finish_non_exhaustive()
    }
}

impl StoreHandle {
    /// A handle on `store`: the loader's seam, for a store that is not HTTP (a test's fake).
    pub fn new(store: Arc<dyn ArtifactStore>) -> StoreHandle {
        StoreHandle { store }
    }
}

impl StoreHandle {
    /// A client for `url`; without the `fetch` feature, an [`FetchError::Unsupported`] error.
    pub fn connect(url: &str, options: &StoreOptions) -> Result<StoreHandle, FetchError> {
        StoreHandle::connect_until(url, options, None)
    }

    /// A client for `url` whose every request and retry ends by `deadline`, when given.
    pub fn connect_until(
        url: &str,
        options: &StoreOptions,
        deadline: Option<Deadline>,
    ) -> Result<StoreHandle, FetchError> {
        #[cfg(feature = "fetch")]
        {
            Store::new(url, options.clone())
                .map(|store| StoreHandle::new(Arc::new(store.until(deadline))))
        }
        #[cfg(not(feature = "fetch"))]
        {
            let _ = (options, deadline);
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
        /// What kind of failure.
        cause: FailureCause,
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
        self.failure().is_none()
    }

    /// What failed, as one error whose [`FetchError::cause`] says what kind (for the exit
    /// code), or `None` when nothing did.
    pub fn failure(&self) -> Option<FetchError> {
        let failed: Vec<(&String, FailureCause)> = self
            .kernels
            .iter()
            .filter_map(|(name, outcome)| match outcome {
                Prefetched::Failed { cause, .. } => Some((name, *cause)),
                _ => None,
            })
            .collect();
        let cause = failed.iter().map(|(_, cause)| *cause).max()?;
        Some(FetchError::Incomplete {
            failed: failed.len(),
            kernels: self.kernels.len(),
            names: failed.into_iter().map(|(name, _)| name.clone()).collect(),
            cause,
        })
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
                Prefetched::Failed { variant, error, .. } => format!("{variant}  FAILED: {error}"),
            };
            writeln!(f, "{kernel:width$}  {line}")?;
        }
        Ok(())
    }
}

/// Makes sure the cubin each kernel would load on the device `query` describes is local:
/// downloads what the bundle and the cache lack from the bundle's store, verifies it and
/// caches it. For machines that go offline. An explicit request: `<PACKAGE>_NO_DOWNLOAD`
/// governs the loader, not this. Everything ends by [`fetch_deadline`].
pub fn prefetch(
    bundle: &Bundle,
    query: &DeviceQuery,
    cache: &ArtifactCache,
    options: &StoreOptions,
) -> Result<PrefetchReport, FetchError> {
    prefetch_within(bundle, query, cache, options, fetch_deadline()?)
}

/// [`prefetch`] with every request and retry ending `deadline` from now: what is not local
/// by then fails as a network failure.
pub fn prefetch_within(
    bundle: &Bundle,
    query: &DeviceQuery,
    cache: &ArtifactCache,
    options: &StoreOptions,
    deadline: Duration,
) -> Result<PrefetchReport, FetchError> {
    let deadline = Deadline::after(deadline);
    let store = std::cell::OnceCell::new();
    let connect = || -> Result<StoreHandle, FetchError> {
        if let Some(handle) = store.get() {
            return Ok(StoreHandle::clone(handle));
        }
        let url = bundle.index().store.as_deref().unwrap_or_default();
        let handle = StoreHandle::connect_until(url, options, Some(deadline))?;
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
                match locate(
                    bundle.root(),
                    bundle.index().store.as_deref(),
                    choice.variant,
                    cache,
                ) {
                    ArtifactLocation::Bundle => Prefetched::InBundle { variant },
                    _ => match obtain_remote(
                        bundle.root(),
                        bundle.index().store.as_deref(),
                        name,
                        choice.variant,
                        cache,
                        &connect,
                    ) {
                        Ok((_, ArtifactLocation::Cache)) => Prefetched::Cached { variant },
                        Ok((bytes, _)) => Prefetched::Fetched {
                            variant,
                            bytes: bytes.len() as u64,
                        },
                        Err(error) => Prefetched::Failed {
                            variant,
                            error: error_chain(&error),
                            cause: error.cause(),
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A store that must not be asked: it fails the test if it is.
    struct Unasked;

    impl ArtifactStore for Unasked {
        fn get_cas(
            &self,
            digest: &str,
            _: Option<u64>,
            _: &str,
        ) -> Result<Option<Vec<u8>>, FetchError> {
            panic!("the store was asked for {digest}");
        }

        fn cas_url(&self, digest: &str) -> String {
            format!("http://127.0.0.1:9/cas/{digest}")
        }
    }

    /// The variant whose artifact is `bytes`, recorded as `size` bytes (a hostile record may
    /// say more than it holds).
    fn variant_of(bytes: &[u8], size: u64) -> Variant {
        let artifact = StoredFile {
            size,
            ..crate::testing::stored_file(bytes, &[0; 8])
        };
        Variant {
            compiler: crate::index::CompilerRecord {
                kind: "nvrtc".to_owned(),
                version: "13.0.88".to_owned(),
            },
            key: artifact.digest.clone(),
            artifact,
            ..crate::testing::variant("cu130/sm_90a")
        }
    }

    /// Issue case 10: an index recording another package's digest at size + 1 made
    /// `kwheel fetch` remove that package's valid cache entry. The claim is refused instead,
    /// as a verification failure, and the entry stays.
    #[test]
    fn fetch_never_evicts_a_valid_cache_entry_another_index_gives_another_size() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path());
        let bytes = b"another package's cubin".to_vec();
        let entry = cache.write(&sha256_hex(&bytes), &bytes).unwrap();
        let store = || Ok(StoreHandle::new(Arc::new(Unasked)));
        for size in [bytes.len() as u64 + 1, bytes.len() as u64 - 1, 0] {
            let hostile = variant_of(&bytes, size);
            let error = obtain_remote(
                dir.path(),
                Some("http://127.0.0.1:9"),
                "k",
                &hostile,
                &cache,
                &store,
            )
            .unwrap_err();
            assert_eq!(error.cause(), FailureCause::Verification, "{error}");
            let message = error.to_string();
            assert!(
                message.contains("the index's claim is refused"),
                "{message}"
            );
            // The cache's own read does not remove it either.
            assert_eq!(cache.read(&hostile.artifact), None);
            assert_eq!(std::fs::read(&entry).unwrap(), bytes, "size {size}");
        }
        // The package it belongs to still reads it, from the cache.
        let own = variant_of(&bytes, bytes.len() as u64);
        let (read, location) = obtain_remote(dir.path(), None, "k", &own, &cache, &store).unwrap();
        assert_eq!((read, location), (bytes.clone(), ArtifactLocation::Cache));
        // A damaged entry (bytes that do not match its digest) is still removed.
        std::fs::write(&entry, b"damaged").unwrap();
        assert_eq!(cache.read(&own.artifact), None);
        assert!(!entry.exists());
    }

    #[test]
    fn a_report_fails_as_its_worst_failure() {
        let failed = |cause| Prefetched::Failed {
            variant: "cu130/sm_90a".into(),
            error: "e".into(),
            cause,
        };
        let mut report = PrefetchReport {
            store: None,
            cache: PathBuf::new(),
            device: "9.0".into(),
            cuda: "cu130".into(),
            kernels: BTreeMap::from([(
                "a".to_owned(),
                Prefetched::Cached {
                    variant: "cu130/sm_90a".into(),
                },
            )]),
        };
        assert!(report.complete() && report.failure().is_none());
        report
            .kernels
            .insert("b".into(), failed(FailureCause::Network));
        assert_eq!(report.failure().unwrap().cause(), FailureCause::Network);
        report
            .kernels
            .insert("c".into(), failed(FailureCause::Verification));
        let failure = report.failure().unwrap();
        assert_eq!(failure.cause(), FailureCause::Verification);
        assert_eq!(
            failure.to_string(),
            "2 of 3 kernels could not be fetched: `b`, `c`"
        );
        let many: Vec<String> = (0..1000).map(|n| format!("k{n}")).collect();
        let listed = crate::untrusted::listed_names(&many);
        assert!(
            listed.ends_with("and 992 more") && listed.len() < 120,
            "{listed}"
        );
    }

    #[test]
    fn tokens_are_not_printed() {
        let options = StoreOptions {
            token: Some("secret".into()),
            ..StoreOptions::default()
        };
        assert!(!format!("{options:?}").contains("secret"));
    }
}
