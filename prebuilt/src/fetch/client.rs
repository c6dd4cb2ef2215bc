//! The store client: reads from a store speaking the bazel-remote HTTP protocol, with
//! timeouts, bounded retries and verified bodies. Uploads are in `upload.rs`, compiled only
//! with the `upload` feature (the build tools'), never into the runtime.

use std::io::Read as _;

use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::StatusCode;

use super::*;
use crate::key::sha256_hex;
use crate::untrusted::{Digest, MAX_ARTIFACT_SIZE};

/// A store speaking the bazel-remote HTTP protocol (`/cas/<sha256>`, `/ac/<key>`).
#[derive(Clone, Debug)]
pub struct Store {
    base: String,
    pub(super) client: Client,
    pub(super) options: StoreOptions,
    /// When set, no request or wait goes past it.
    deadline: Option<Deadline>,
}

/// One request's outcome, before the caller decides what it means.
pub(super) enum Answer {
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
            deadline: None,
        })
    }

    /// The same client, every request and retry of which ends by `deadline` (none: each
    /// request is bounded by its own timeout only).
    pub fn until(mut self, deadline: Option<Deadline>) -> Store {
        self.deadline = deadline;
        self
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
    pub(super) fn send(
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
            let mut ends = None;
            if let Some(deadline) = self.deadline {
                let remaining = deadline.remaining();
                if remaining.is_zero() {
                    return Err(FetchError::Transport {
                        action,
                        what: what.to_owned(),
                        url: url.to_owned(),
                        attempts: attempt - 1,
                        source: deadline.passed().into(),
                    });
                }
                let timeout = self.options.timeout_for(limit).min(remaining);
                request = request.timeout(timeout);
                ends = Some((deadline, Instant::now() + timeout));
            }
            let outcome = request
                .send()
                .map_err(|error| Box::new(error) as Box<dyn std::error::Error + Send + Sync>)
                .and_then(|response| read_answer(response, limit, ends));
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
            let mut wait = self.options.backoff_before(attempt);
            if let Some(deadline) = self.deadline {
                wait = wait.min(deadline.remaining());
            }
            std::thread::sleep(wait);
        }
    }
}

/// Statuses worth asking again.
fn transient(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// The answer `response` carries, its body read up to `limit` bytes; with `ends` (the
/// overall deadline and this request's end), a body that trickles in stops there.
fn read_answer(
    response: Response,
    limit: u64,
    ends: Option<(Deadline, Instant)>,
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
    match ends {
        None => {
            response.take(limit).read_to_end(&mut bytes)?;
        }
        Some((deadline, request_ends)) => {
            // A read blocks at most the request's timeout; a server that sends a byte now and
            // then is stopped here, between reads.
            let mut body = response.take(limit);
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                let read = body.read(&mut chunk)?;
                if read == 0 {
                    break;
                }
                bytes.extend_from_slice(&chunk[..read]);
                let now = Instant::now();
                if now >= deadline.at {
                    return Err(deadline.passed().into());
                }
                if now >= request_ends {
                    return Err("the request timed out reading the body".into());
                }
            }
        }
    }
    if let Some(declared) = declared {
        if declared > bytes.len() as u64 && (bytes.len() as u64) < limit {
            return Err(format!("the body ended after {} of {declared} bytes", bytes.len()).into());
        }
    }
    Ok(Answer::Body(bytes))
}

impl ArtifactStore for Store {
    fn get_cas(
        &self,
        digest: &str,
        size: Option<u64>,
        what: &str,
    ) -> Result<Option<Vec<u8>>, FetchError> {
        Store::get_cas(self, digest, size, what)
    }

    fn cas_url(&self, digest: &str) -> String {
        Store::cas_url(self, digest)
    }
}
