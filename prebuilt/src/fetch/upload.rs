//! Uploads to a store (`PUT`), for the build tools only: the bundler's shared cache and
//! `release publish`. Compiled with the `upload` feature; the runtime never writes to a store.

use super::client::{Answer, Store};
use super::FetchError;

impl Store {
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
}
