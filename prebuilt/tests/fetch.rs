//! Slim bundles: artifacts fetched from a store (the `fetch` feature). The store is the
//! fault-injecting loopback server of `testkit::loopback_store`; the fault cases run on a CPU
//! through `prebuilt::fetch`, which is what the loader calls; the last test loads on a GPU.
#![cfg(feature = "fetch")]

mod common;

use common::*;
use prebuilt::cache::ArtifactCache;
use prebuilt::coverage::bundle_coverage as coverage;
use prebuilt::device::{DeviceQuery, DriverVersion};
use prebuilt::fetch::{obtain_remote, prefetch, FetchError, Prefetched, StoreHandle, StoreOptions};
use prebuilt::index::ArtifactLocation;
use prebuilt::DownloadPolicy;
use testkit::loopback_store::{Fault, LoopbackStore};

/// Short timeouts and backoff, so that the fault cases take well under a second each.
fn quick() -> StoreOptions {
    StoreOptions {
        connect_timeout: Duration::from_millis(500),
        timeout: Duration::from_millis(400),
        attempts: 3,
        backoff: Duration::from_millis(10),
        token: None,
    }
}

/// The fixture bundle without the artifacts of `arch`, recording `store`, with every
/// cubin in the store under its sha256.
fn slim_bundle(dir: &Path, arch_left_out: &str, store: &LoopbackStore) -> PathBuf {
    let root = fixture_bundle(dir);
    let mut index = Bundle::open(&root).unwrap().index().clone();
    for (bytes, ..) in FIXTURE_CUBINS {
        store.insert(&format!("/cas/{}", sha256_hex(bytes)), bytes);
    }
    for record in index.kernels.values() {
        for variant in &record.variants {
            if variant.arch == arch(arch_left_out) {
                let _ = fs::remove_file(root.join(&variant.artifact.path));
            }
        }
    }
    index.set_store(Some(store.url()));
    write_index(&root, &index);
    root
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        if entry.file_type().unwrap().is_dir() {
            found.extend(files_under(&entry.path()));
        } else {
            found.push(entry.path());
        }
    }
    found
}

fn sm_100(cuda: &str) -> DeviceQuery {
    DeviceQuery {
        capability: (10, 0),
        driver: DriverVersion {
            major: 13,
            minor: 0,
        },
        cuda: build(cuda),
        torch: None,
    }
}

#[test]
fn prefetch_brings_a_devices_variants_into_the_cache_and_they_turn_local() {
    let dir = tempfile::tempdir().unwrap();
    let store = LoopbackStore::start();
    let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
    assert!(bundle.index().format >= prebuilt::index::STORE_INDEX_FORMAT);
    assert_eq!(bundle.index().format, bundle.index().required_format());
    let cache = ArtifactCache::new(dir.path().join("artifacts"));
    let query = sm_100("cu130");

    let before = coverage(&bundle, &query, None, &cache);
    for (name, kernel) in &before.kernels {
        assert_eq!(kernel.loads.as_deref(), Some("cu130/sm_100a"), "{name}");
        assert_eq!(kernel.location, Some(ArtifactLocation::Store), "{name}");
    }
    assert!(before.to_string().contains("remote"), "{before}");

    let report = prefetch(&bundle, &query, &cache, &quick()).unwrap();
    assert!(report.complete(), "{report}");
    // Both fixture kernels share their cubins: the second finds the first's download.
    let fetched = report
        .kernels
        .values()
        .filter(|outcome| matches!(outcome, Prefetched::Fetched { .. }))
        .count();
    assert_eq!(fetched, 1, "{report}");
    let cubin = FIXTURE_CUBINS[3].0;
    let entry = cache.entry_path(&sha256_hex(cubin)).unwrap();
    assert_eq!(fs::read(&entry).unwrap(), cubin);

    let after = coverage(&bundle, &query, None, &cache);
    for (name, kernel) in &after.kernels {
        assert_eq!(kernel.location, Some(ArtifactLocation::Cache), "{name}");
    }
    assert!(after.to_string().contains("local (cache)"), "{after}");
    // sm_90a stays in the wheel; nothing is fetched for it.
    let h100 = DeviceQuery {
        capability: (9, 0),
        ..query.clone()
    };
    for kernel in coverage(&bundle, &h100, None, &cache).kernels.values() {
        assert_eq!(kernel.location, Some(ArtifactLocation::Bundle));
    }

    // Offline now: a second prefetch needs the store no more.
    let gets = store.requests().len();
    store.fail_always(Some(Fault::Status(503)));
    let again = prefetch(&bundle, &query, &cache, &quick()).unwrap();
    assert!(again
        .kernels
        .values()
        .all(|outcome| matches!(outcome, Prefetched::Cached { .. })));
    assert_eq!(store.requests().len(), gets);
}

/// Asks for `fixture_axpy`'s cu130/sm_100a cubin through a store answering with `faults`,
/// into a fresh cache; returns the result and the cache directory.
fn fetch_with(
    faults: &[Fault],
    always: Option<Fault>,
) -> (Result<Vec<u8>, FetchError>, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let store = LoopbackStore::start();
    let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
    store.fail_next(faults.iter().cloned());
    store.fail_always(always);
    let cache = ArtifactCache::new(dir.path().join("artifacts"));
    let record = &bundle.index().kernels["fixture_axpy"];
    let variant = record
        .variants
        .iter()
        .find(|v| v.label() == "cu130/sm_100a")
        .unwrap();
    let url = format!("{}/cas/{}", store.url(), variant.artifact.digest);
    let connect = || StoreHandle::connect(&store.url(), &quick());
    let result = obtain_remote(
        bundle.root(),
        bundle.index().store.as_deref(),
        "fixture_axpy",
        variant,
        &cache,
        &connect,
    )
    .map(|(bytes, _)| bytes);
    (result, dir, url)
}

fn assert_fails_cleanly(faults: &[Fault], always: Option<Fault>, says: &str) {
    let started = Instant::now();
    let (result, dir, url) = fetch_with(faults, always);
    let error = result.unwrap_err();
    let text = error_chain(&error);
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("`fixture_axpy` (cu130/sm_100a)"), "{text}");
    assert!(text.contains(says), "{text}");
    // Nothing partial, nothing unverified: the cache is empty, temp files included.
    assert_eq!(
        files_under(&dir.path().join("artifacts")),
        Vec::<PathBuf>::new()
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn server_errors_are_retried_then_named() {
    // One 500 and one 503, then the object: retried, verified, cached.
    let (result, dir, _) = fetch_with(&[Fault::Status(500), Fault::Status(503)], None);
    assert_eq!(result.unwrap(), FIXTURE_CUBINS[3].0);
    assert_eq!(files_under(&dir.path().join("artifacts")).len(), 1);
    // 500 every time: three attempts, then an error naming the URL and the kernel.
    assert_fails_cleanly(&[], Some(Fault::Status(500)), "answered 500 (3 attempts)");
}

#[test]
fn a_connection_dropped_mid_body_leaves_nothing() {
    let (result, _dir, _) = fetch_with(&[Fault::DropMidBody], None);
    assert_eq!(
        result.unwrap(),
        FIXTURE_CUBINS[3].0,
        "retried after the drop"
    );
    assert_fails_cleanly(&[], Some(Fault::DropMidBody), "3 attempts");
}

#[test]
fn wrong_bytes_with_a_200_are_never_cached() {
    assert_fails_cleanly(
        &[],
        Some(Fault::WrongBytes),
        "failed verification: expected sha256",
    );
}

#[test]
fn a_slow_server_times_out() {
    assert_fails_cleanly(
        &[],
        Some(Fault::Slow(Duration::from_millis(1500))),
        "3 attempts",
    );
}

#[test]
fn a_missing_object_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = LoopbackStore::start();
    let bundle = Bundle::open(slim_bundle(dir.path(), "sm_100a", &store)).unwrap();
    for path in store.paths() {
        store.insert(&path, b"");
    }
    let empty = LoopbackStore::start();
    let cache = ArtifactCache::new(dir.path().join("artifacts"));
    let variant = &bundle.index().kernels["fixture_scalars"].variants[1];
    let connect = || StoreHandle::connect(&empty.url(), &quick());
    let error = obtain_remote(
        bundle.root(),
        bundle.index().store.as_deref(),
        "fixture_scalars",
        variant,
        &cache,
        &connect,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("answered 404; the store does not have it"),
        "{error}"
    );
    assert!(
        error.contains("`fixture_scalars` (cu129/sm_100a)"),
        "{error}"
    );
}

#[test]
fn the_no_download_variable_follows_the_package() {
    assert!(DownloadPolicy::Allowed.allows_download("kwheel-fixtures"));
    assert!(!DownloadPolicy::Forbidden.allows_download("kwheel-fixtures"));
    assert_eq!(
        prebuilt::env::no_download_variable("kwheel-fixtures"),
        "KWHEEL_FIXTURES_NO_DOWNLOAD"
    );
}

/// On a 9.0 GPU: a slim bundle without sm_90a loads sm_90a from the store on first call,
/// verified; a store serving wrong bytes loads nothing; with downloads forbidden and the
/// JIT off, the error says what was not fetched.
#[test]
fn slim_bundle_fetches_verifies_and_loads_on_a_gpu() {
    match Driver::get().and_then(|driver| driver.device(0)) {
        Ok(device) if device.capability() == (9, 0) => {}
        Ok(device) => return skipped!("skipped: device 0 is compute {:?}", device.capability()),
        Err(error) => return skipped!("skipped: {error}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let store = LoopbackStore::start();
    let bundle = slim_bundle(dir.path(), "sm_90a", &store);
    let registry_options = |cache: &str, downloads| RegistryOptions {
        torch: None,
        downloads,
        artifact_cache: dir.path().join(cache),
        store: quick(),
        ..options(Some("cu130"), JitPolicy::Disabled, &dir.path().join("jit"))
    };

    let registry =
        Registry::open_with(&bundle, registry_options("good", DownloadPolicy::Allowed)).unwrap();
    let Status::Available { location, .. } = &registry.status()["fixture_axpy"] else {
        panic!("{:?}", registry.status());
    };
    assert_eq!(*location, Some(ArtifactLocation::Store));
    let started = Instant::now();
    let kernel = registry.load("fixture_axpy").unwrap();
    let first_call = started.elapsed();
    assert_eq!(kernel.location(), Some(ArtifactLocation::Cache));
    assert_eq!(
        kernel.provenance(),
        &Provenance::Prebuilt {
            variant: "cu130/sm_90a".into(),
            key: registry.index().unwrap().kernels["fixture_axpy"].variants[2]
                .key
                .clone(),
        }
    );
    eprintln!("first call with a loopback fetch: {first_call:?}");
    assert_eq!(files_under(&dir.path().join("good")).len(), 1);

    store.fail_always(Some(Fault::WrongBytes));
    let registry =
        Registry::open_with(&bundle, registry_options("wrong", DownloadPolicy::Allowed)).unwrap();
    let error = registry.load("fixture_axpy").unwrap_err();
    let text = error_chain(&error);
    assert!(matches!(error, LoadError::Fetch { .. }), "{text}");
    assert!(
        text.contains(&store.url()) && text.contains("`fixture_axpy`"),
        "{text}"
    );
    assert!(text.contains("KWHEEL_FIXTURES_NO_DOWNLOAD=1"), "{text}");
    assert!(files_under(&dir.path().join("wrong")).is_empty());

    let registry =
        Registry::open_with(&bundle, registry_options("none", DownloadPolicy::Forbidden)).unwrap();
    let error = registry.load("fixture_axpy").unwrap_err().to_string();
    assert!(
        error.contains("cu130/sm_90a: fits, but is only in the store"),
        "{error}"
    );
    assert!(files_under(&dir.path().join("none")).is_empty());
}
