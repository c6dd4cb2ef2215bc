//! Distribution over HTTP: which variants a slim wheel ships, and publishing wheels and every
//! artifact of a bundle to a content-addressed store.
//!
//! ```text
//! kwheel release publish --to <store> --bundle _prebuilt/ wheels/*.whl
//!   for each cubin of the bundle (decompressed, sha256 checked) and each wheel:
//!     HEAD <store>/cas/<sha256>   200: already there, skipped
//!     PUT  <store>/cas/<sha256>   the bytes
//!     GET  <store>/cas/<sha256>   downloaded again and compared: published means readable
//! ```
//!
//! The store speaks the bazel-remote HTTP protocol (bazel-remote, or nginx with WebDAV `PUT`);
//! a cubin's key is the sha256 of the uncompressed cubin, the digest the index records, so a
//! slim wheel's loader verifies a download against its own index (see `prebuilt::fetch`). A
//! wheel's key is the sha256 of the wheel file. The bearer token comes from
//! `KWHEEL_STORE_TOKEN`, never from a command line.
//!
//! A slim wheel (`dev build-wheel --ship <filter>`) carries only the artifacts of the variants
//! the filter names, and an index that still lists every variant with its digest and records
//! the store: publish the full bundle before releasing the slim wheel.

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use prebuilt::error_chain;
use prebuilt::fetch::{FetchError, Store, StoreOptions};
use prebuilt::index::{Index, Variant};
use prebuilt::key::sha256_hex;
use prebuilt::{Arch, Bundle, CudaBuild};
use serde::Serialize;

use crate::Error;

/// Which variants a slim wheel ships: a comma-separated list of terms, each an arch
/// (`sm_90a`), a CUDA build (`cu130`) or both (`cu130:sm_100a`). A variant ships when any
/// term names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShipFilter {
    terms: Vec<ShipTerm>,
    text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ShipTerm {
    cuda: Option<CudaBuild>,
    arch: Option<Arch>,
}

impl ShipTerm {
    fn matches(&self, variant: &Variant) -> bool {
        self.cuda.is_none_or(|cuda| cuda == variant.cuda)
            && self.arch.is_none_or(|arch| arch == variant.arch)
    }
}

impl fmt::Display for ShipTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.cuda, self.arch) {
            (Some(cuda), Some(arch)) => write!(f, "{cuda}:{arch}"),
            (Some(cuda), None) => write!(f, "{cuda}"),
            (None, Some(arch)) => write!(f, "{arch}"),
            (None, None) => Ok(()),
        }
    }
}

impl std::str::FromStr for ShipFilter {
    type Err = Error;

    fn from_str(text: &str) -> Result<ShipFilter, Error> {
        let invalid = |term: &str, reason: String| Error::InvalidShipFilter {
            filter: text.to_owned(),
            term: term.to_owned(),
            reason,
        };
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim) {
            if term.is_empty() {
                return Err(invalid(term, "an empty term".into()));
            }
            let parsed = match term.split_once(':') {
                Some((cuda, arch)) => ShipTerm {
                    cuda: Some(cuda.parse().map_err(|e| invalid(term, format!("{e}")))?),
                    arch: Some(arch.parse().map_err(|e| invalid(term, format!("{e}")))?),
                },
                None if term.starts_with("cu") => ShipTerm {
                    cuda: Some(term.parse().map_err(|e| invalid(term, format!("{e}")))?),
                    arch: None,
                },
                None => ShipTerm {
                    cuda: None,
                    arch: Some(term.parse().map_err(|e| invalid(term, format!("{e}")))?),
                },
            };
            terms.push(parsed);
        }
        Ok(ShipFilter {
            terms,
            text: text.trim().to_owned(),
        })
    }
}

impl fmt::Display for ShipFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl ShipFilter {
    /// Whether `variant` ships in the wheel.
    pub fn ships(&self, variant: &Variant) -> bool {
        self.terms.iter().any(|term| term.matches(variant))
    }

    /// Refuses a filter with a term that names no variant of `index` (a typo ships nothing
    /// and would pass unnoticed otherwise).
    pub fn check(&self, index: &Index) -> Result<(), Error> {
        let variants: Vec<&Variant> = index
            .kernels
            .values()
            .flat_map(|record| &record.variants)
            .collect();
        for term in &self.terms {
            if !variants.iter().any(|variant| term.matches(variant)) {
                let available: BTreeSet<String> = variants
                    .iter()
                    .map(|variant| format!("{}:{}", variant.cuda, variant.arch))
                    .collect();
                return Err(Error::InvalidShipFilter {
                    filter: self.text.clone(),
                    term: term.to_string(),
                    reason: format!(
                        "no variant of the bundle matches it (it has {})",
                        available.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
        Ok(())
    }
}

/// What `release publish` uploads, and where.
#[derive(Clone, Debug)]
pub struct PublishOptions {
    /// The store's base URL (`--to`).
    pub store: String,
    /// Bundles whose every artifact is published (decompressed: the store holds cubins).
    pub bundles: Vec<PathBuf>,
    /// Wheels to publish, by content.
    pub wheels: Vec<PathBuf>,
    /// Timeouts, retries and the token ([`prebuilt::fetch::STORE_TOKEN_ENV`]).
    pub client: StoreOptions,
}

impl PublishOptions {
    /// Publishing `bundles` and `wheels` to `store`, with the default client settings.
    pub fn new(store: impl Into<String>) -> PublishOptions {
        PublishOptions {
            store: store.into(),
            bundles: Vec::new(),
            wheels: Vec::new(),
            client: StoreOptions::default(),
        }
    }
}

/// What happened to one published object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Published {
    /// Uploaded, then downloaded again and found identical.
    Uploaded,
    /// Already in the store (`HEAD` answered 200), then downloaded and found identical.
    AlreadyThere,
}

/// One object of a [`PublishReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PublishedObject {
    /// What it is: `` `swiglu` (cu130/sm_90a) ``, or the wheel's file name.
    pub what: String,
    /// Its sha256, the key in the store.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its URL.
    pub url: String,
    /// Whether it was uploaded or was there already.
    pub outcome: Published,
}

/// Everything `release publish` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PublishReport {
    /// The store.
    pub store: String,
    /// Every object, cubins first (by digest), then wheels, each once.
    pub objects: Vec<PublishedObject>,
}

impl PublishReport {
    /// Objects uploaded by this run.
    pub fn uploaded(&self) -> usize {
        self.objects
            .iter()
            .filter(|object| object.outcome == Published::Uploaded)
            .count()
    }
}

impl fmt::Display for PublishReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for object in &self.objects {
            let outcome = match object.outcome {
                Published::Uploaded => "uploaded",
                Published::AlreadyThere => "already there",
            };
            writeln!(
                f,
                "{outcome:13}  {}  {} ({} bytes)",
                object.url, object.what, object.size
            )?;
        }
        let uploaded = self.uploaded();
        writeln!(
            f,
            "{} objects in {}: {uploaded} uploaded, {} already there; all verified by download",
            self.objects.len(),
            self.store,
            self.objects.len() - uploaded
        )
    }
}

/// Publishes every artifact of `options.bundles` (as cubins) and every wheel of
/// `options.wheels` to the store, skipping what is already there, and verifies each by
/// downloading it again. Stops at the first failure, naming the object and the URL.
pub fn publish(options: &PublishOptions) -> Result<PublishReport, Error> {
    let store = Store::new(&options.store, options.client.clone()).map_err(Box::new)?;
    let mut objects = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in &options.bundles {
        let bundle = Bundle::open(dir)?;
        for (kernel, record) in &bundle.index().kernels {
            for variant in &record.variants {
                if !seen.insert(variant.artifact.digest.clone()) {
                    continue;
                }
                let cubin = bundle.read_artifact(kernel, variant)?;
                let what = prebuilt::fetch::describe(kernel, variant);
                objects.push(publish_one(
                    &store,
                    &what,
                    &variant.artifact.digest,
                    &cubin,
                )?);
            }
        }
    }
    for wheel in &options.wheels {
        let bytes = std::fs::read(wheel).map_err(|source| {
            Error::Read(Unreadable {
                path: wheel.clone(),
                source,
            })
        })?;
        let digest = sha256_hex(&bytes);
        if !seen.insert(digest.clone()) {
            continue;
        }
        let what = format!("wheel `{}`", file_name(wheel));
        objects.push(publish_one(&store, &what, &digest, &bytes)?);
    }
    Ok(PublishReport {
        store: store.url().to_owned(),
        objects,
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}

fn publish_one(
    store: &Store,
    what: &str,
    digest: &str,
    bytes: &[u8],
) -> Result<PublishedObject, Error> {
    let failed = |error: FetchError| Error::Publish {
        what: what.to_owned(),
        url: store.cas_url(digest),
        reason: error_chain(&error),
    };
    let outcome = if store.contains_cas(digest, what).map_err(failed)? {
        Published::AlreadyThere
    } else {
        store.put_cas(digest, bytes, what).map_err(failed)?;
        Published::Uploaded
    };
    // Published means a client can read it back: the download is checked against the digest.
    match store.get_cas(digest, Some(bytes.len() as u64), what) {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(Error::Publish {
                what: what.to_owned(),
                url: store.cas_url(digest),
                reason: "the store answered 404 right after the upload".into(),
            })
        }
        Err(error) => return Err(failed(error)),
    }
    Ok(PublishedObject {
        what: what.to_owned(),
        digest: digest.to_owned(),
        size: bytes.len() as u64,
        url: store.cas_url(digest),
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(cuda: &str, arch: &str) -> Variant {
        Variant {
            structs: Default::default(),
            arch: arch.parse().unwrap(),
            cuda: cuda.parse().unwrap(),
            torch: "2.13.*".into(),
            compiler: prebuilt::index::CompilerRecord {
                kind: "nvcc".into(),
                version: "13.0.88".into(),
            },
            key: String::new(),
            artifact: prebuilt::index::StoredFile {
                digest: String::new(),
                size: 0,
                path: String::new(),
                stored_size: 0,
                dictionary: None,
            },
            functions: Vec::new(),
        }
    }

    #[test]
    fn filters_name_archs_builds_or_both() {
        let filter: ShipFilter = "sm_90a, cu130:sm_100a".parse().unwrap();
        assert!(filter.ships(&variant("cu129", "sm_90a")));
        assert!(filter.ships(&variant("cu130", "sm_90a")));
        assert!(filter.ships(&variant("cu130", "sm_100a")));
        assert!(!filter.ships(&variant("cu129", "sm_100a")));
        let build: ShipFilter = "cu129".parse().unwrap();
        assert!(build.ships(&variant("cu129", "sm_100a")));
        assert!(!build.ships(&variant("cu130", "sm_100a")));
        for bad in ["", "sm_90a,", "cu130:", "gfx90a", "cu13x:sm_90a"] {
            assert!(bad.parse::<ShipFilter>().is_err(), "{bad}");
        }
    }
}
