//! Distribution: slim wheels, publishing to a store, prefetch from it. The store is the server
//! `.ci/run` starts (nginx with WebDAV PUT, `KWHEEL_TEST_STORE`; skipped without it unless
//! `KWHEEL_REQUIRE_STORE=1`), or the fault-injecting loopback store of the test kit.

use super::*;

use super::loopback_store::{Fault, LoopbackStore};
use prebuilt::cache::ArtifactCache;
use prebuilt::coverage::bundle_coverage as coverage;
use prebuilt::device::{DeviceQuery, DriverVersion};
use prebuilt::fetch::{prefetch, Prefetched, StoreOptions};
use prebuilt::index::ArtifactLocation;
use prebuilt::lookup::find_bundle;
use release::publish::{publish, PublishOptions, Published, ShipFilter};
use std::time::Duration;

/// A device of `capability` with a CUDA 13.0 driver and runtime, any torch.
fn cuda_13_0_device(capability: (u32, u32)) -> DeviceQuery {
    DeviceQuery {
        capability,
        driver: DriverVersion {
            major: 13,
            minor: 0,
        },
        cuda: "cu130".parse().unwrap(),
        torch: None,
    }
}

/// The server `.ci/run` starts, under a path prefix of this run's own; `None` (skipped)
/// without one.
fn test_store(test: &str) -> Option<String> {
    match std::env::var("KWHEEL_TEST_STORE") {
        Ok(url) if !url.is_empty() => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            Some(format!("{url}/{test}-{}-{nanos}", std::process::id()))
        }
        _ if std::env::var("KWHEEL_REQUIRE_STORE").as_deref() == Ok("1") => {
            panic!("KWHEEL_REQUIRE_STORE=1 but KWHEEL_TEST_STORE names no server")
        }
        _ => {
            skipped("KWHEEL_TEST_STORE names no server (`.ci/run` starts one)");
            None
        }
    }
}

fn quick() -> StoreOptions {
    StoreOptions {
        connect_timeout: Duration::from_millis(500),
        timeout: Duration::from_secs(2),
        attempts: 2,
        backoff: Duration::from_millis(10),
        token: None,
    }
}

fn slim_wheel(shared: &Shared, name: &str, ship: &str, store: &str) -> BuiltWheel {
    build_library_wheel(&LibraryWheelOptions {
        ship: Some(ship.parse().unwrap()),
        store: Some(store.to_owned()),
        ..options(
            &default_manifest(),
            &shared.bundle,
            &shared.root.join(name),
            &shared.cache,
        )
    })
    .unwrap_or_else(|error| panic!("{}", chain(&error)))
}

/// Unzips `wheel` into `site` as pip would (enough for a package with no scripts).
fn install(wheel: &Path, site: &Path) {
    let bytes = std::fs::read(wheel).unwrap();
    for (name, data) in entries(&bytes) {
        let path = site.join(&name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
}

#[test]
fn a_slim_wheel_ships_only_its_filter_and_lists_everything() {
    let Some(shared) = shared() else { return };
    let built = slim_wheel(
        shared,
        "wheels-slim",
        "sm_90a",
        "https://cache.example.com/",
    );
    let bytes = std::fs::read(&built.path).unwrap();
    let names: Vec<String> = entries(&bytes).into_iter().map(|(n, _)| n).collect();
    // The wheel ships the loader index only, which holds the whole index.
    let index = wheel_index(&bytes);
    // A store needs format 2 at least; family dictionaries make it 3.
    assert!(index.format >= prebuilt::index::STORE_INDEX_FORMAT);
    assert_eq!(index.format, index.required_format());
    assert_eq!(index.store.as_deref(), Some("https://cache.example.com"));
    let full = prebuilt::Bundle::open(&shared.bundle).unwrap();
    // A shipped frame compressed against another cubin (its reference) needs that cubin's
    // artifact too, whatever its target: it ships as well, and nothing else does.
    let references: std::collections::BTreeSet<&String> = index
        .kernels
        .values()
        .flat_map(|record| &record.variants)
        .filter(|variant| variant.arch.to_string() == "sm_90a")
        .filter_map(|variant| variant.artifact.dictionary.as_ref())
        .collect();
    let (mut remote, mut other_targets) = (0, 0);
    for (kernel, record) in &index.kernels {
        assert_eq!(
            record,
            &full.index().kernels[kernel],
            "every variant listed"
        );
        for variant in &record.variants {
            let path = format!("af3_kernels/_prebuilt/{}", variant.artifact.path);
            let shipped = names.contains(&path);
            let wanted = variant.arch.to_string() == "sm_90a";
            let reference = references.contains(&variant.artifact.digest);
            assert_eq!(shipped, wanted || reference, "{path}");
            remote += usize::from(!shipped);
            other_targets += usize::from(!wanted);
        }
    }
    assert_eq!(
        other_targets, 36,
        "6 kernels × 2 builds have sm_100a, sm_100f and compute_90"
    );
    assert!(
        remote <= 36 && remote + references.len() >= 36,
        "{remote} left to the store"
    );
    assert_eq!(built.report.bundles[0].remote, remote);
    // The 14 sm_90a variants, and those whose cubin ships as a reference.
    assert_eq!(built.report.bundles[0].variants, 14 + (36 - remote));
    assert!(built.size < shared.built.size);
    // The bundle on disk is unchanged: no store, and the format its artifacts need.
    assert_eq!(full.index().format, full.index().required_format());
    assert!(!std::fs::read_to_string(shared.bundle.join("index.json"))
        .unwrap()
        .contains("\"store\""));

    let error = build_library_wheel(&LibraryWheelOptions {
        ship: Some("sm_90a".parse().unwrap()),
        ..options(
            &default_manifest(),
            &shared.bundle,
            &shared.root.join("wheels-no-store"),
            &shared.cache,
        )
    })
    .unwrap_err();
    assert!(
        matches!(error, Error::NoStore { left_out: 36, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("--store <url>"), "{error}");
    let error = build_library_wheel(&LibraryWheelOptions {
        ship: Some("cu128:sm_90a".parse().unwrap()),
        store: Some("https://cache.example.com".into()),
        ..options(
            &default_manifest(),
            &shared.bundle,
            &shared.root.join("wheels-typo"),
            &shared.cache,
        )
    })
    .unwrap_err();
    assert!(
        error.to_string().starts_with(
            "invalid --ship filter `cu128:sm_90a`: `cu128:sm_90a`: no variant of the bundle \
             matches it (it has cu129:compute_90, cu129:sm_100a, cu129:sm_100f, cu129:sm_90a,"
        ),
        "{error}"
    );
    assert!("cu130:".parse::<ShipFilter>().is_err());
}

/// The acceptance run: a slim wheel holding only sm_90a, installed; the full
/// bundle published to the loopback server; a prefetch for sm_100 brings the sm_100a
/// variants, verified, into the cache; selection for sm_100 then reports them local.
#[test]
fn publish_then_prefetch_for_another_device_makes_its_variants_local() {
    let Some(shared) = shared() else { return };
    let Some(store) = test_store("publish") else {
        return;
    };
    let built = slim_wheel(shared, "wheels-published", "sm_90a", &store);

    let options = PublishOptions {
        bundles: vec![shared.bundle.clone()],
        wheels: vec![built.path.clone(), built.path.clone()],
        client: quick(),
        ..PublishOptions::new(&store)
    };
    let report = publish(&options).unwrap();
    // 50 variants; the wheel once, though named twice.
    let cubins = report.objects.len() - 1;
    assert!(cubins > 0 && cubins <= 50, "{report}");
    assert_eq!(report.uploaded(), report.objects.len(), "{report}");
    assert!(report.to_string().contains("all verified by download"));
    let again = publish(&options).unwrap();
    assert!(again
        .objects
        .iter()
        .all(|object| object.outcome == Published::AlreadyThere));

    let site = scratch("distribution-site");
    install(&built.path, &site);
    let bundle_dir = find_bundle(site.join("af3_kernels").to_str().unwrap()).unwrap();
    let bundle = prebuilt::lookup::open_bundle(&bundle_dir).unwrap();
    let cache = ArtifactCache::new(site.join("artifact-cache"));
    let b200 = cuda_13_0_device((10, 0));
    let before = coverage(&bundle, &b200, None, &cache);
    assert!(before.to_string().contains("remote"), "{before}");

    let prefetched = prefetch(&bundle, &b200, &cache, &quick()).unwrap();
    assert!(prefetched.complete(), "{prefetched}");
    let fetched = prefetched
        .kernels
        .values()
        .filter(|outcome| matches!(outcome, Prefetched::Fetched { .. }))
        .count();
    // Every kernel but wgmma (sm_90a only) has an sm_100a cubin in the store.
    assert_eq!(fetched, 6, "{prefetched}");
    assert!(matches!(
        prefetched.kernels["wgmma_matmul_bf16"],
        Prefetched::NothingFits { .. }
    ));

    let after = coverage(&bundle, &b200, None, &cache);
    for (name, kernel) in &after.kernels {
        match &kernel.loads {
            Some(label) => {
                assert_eq!(label, "cu130/sm_100a", "{name}");
                assert_eq!(kernel.location, Some(ArtifactLocation::Cache), "{name}");
            }
            None => assert_eq!(name, "wgmma_matmul_bf16"),
        }
    }
    // What was cached is what the index names, byte for byte.
    for (name, record) in &bundle.index().kernels {
        for variant in record
            .variants
            .iter()
            .filter(|v| v.label() == "cu130/sm_100a")
        {
            let cached =
                std::fs::read(cache.entry_path(&variant.artifact.digest).unwrap()).unwrap();
            let full = prebuilt::Bundle::open(&shared.bundle).unwrap();
            assert_eq!(cached, full.read_artifact(name, variant).unwrap(), "{name}");
        }
    }
}

/// `cargo test --release -p release --test run bench_first_call -- --ignored --nocapture`
/// with `KWHEEL_TEST_STORE` set: the CPU side of a first call, per kernel, for the
/// cu130/sm_90a variant — from the wheel (select, read, decompress, verify) against a
/// lazy fetch from the loopback store (select, GET, verify, write to the cache) and the
/// next process's read from the cache (select, read, verify). Medians of 25.
#[test]
#[ignore = "a benchmark: run it by name with --ignored"]
fn bench_first_call_fetch_vs_wheel() {
    use prebuilt::fetch::{obtain_remote, StoreHandle};
    use prebuilt::select::select_variant;
    use std::time::Instant;
    let Some(shared) = shared() else { return };
    let Some(store) = test_store("bench") else {
        return;
    };
    let built = slim_wheel(shared, "wheels-bench", "sm_100a", &store);
    publish(&PublishOptions {
        bundles: vec![shared.bundle.clone()],
        client: quick(),
        ..PublishOptions::new(&store)
    })
    .unwrap();
    let site = scratch("bench-site");
    install(&built.path, &site);
    let slim = site.join("af3_kernels/_prebuilt");
    let h200 = cuda_13_0_device((9, 0));
    let median = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    println!(
        "| kernel | cubin | from the wheel | lazy fetch: client setup | GET + verify + \
         cache write | from the cache |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let bundled = &shared.built.bundled.as_ref().unwrap().index;
    for name in bundled.kernels.keys() {
        let (mut wheel, mut setup, mut fetch, mut cached) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut size = 0;
        for run in 0..25 {
            let started = Instant::now();
            let bundle = prebuilt::Bundle::open(&shared.bundle).unwrap();
            let record = &bundle.index().kernels[name];
            let choice = select_variant(name, record, &h200).unwrap();
            let cubin = bundle.read_artifact(name, choice.variant).unwrap();
            wheel.push(started.elapsed().as_secs_f64() * 1e3);
            size = cubin.len();

            let cache = ArtifactCache::new(site.join(format!("cache-{name}-{run}")));
            let started = Instant::now();
            let handle = StoreHandle::connect(&store, &quick()).unwrap();
            setup.push(started.elapsed().as_secs_f64() * 1e3);
            let started = Instant::now();
            let bundle = prebuilt::lookup::open_bundle(&slim).unwrap();
            let record = &bundle.index().kernels[name];
            let choice = select_variant(name, record, &h200).unwrap();
            let connect = || Ok(handle.clone());
            let (fetched, _) = obtain_remote(
                bundle.root(),
                bundle.index().store.as_deref(),
                name,
                choice.variant,
                &cache,
                &connect,
            )
            .unwrap();
            fetch.push(started.elapsed().as_secs_f64() * 1e3);
            assert_eq!(fetched, cubin);

            let started = Instant::now();
            let bundle = prebuilt::lookup::open_bundle(&slim).unwrap();
            let record = &bundle.index().kernels[name];
            let choice = select_variant(name, record, &h200).unwrap();
            let again = cache.read(&choice.variant.artifact).unwrap();
            cached.push(started.elapsed().as_secs_f64() * 1e3);
            assert_eq!(again, cubin);
        }
        println!(
            "| `{name}` | {:.1} KiB | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
            size as f64 / 1024.0,
            median(wheel),
            median(setup),
            median(fetch),
            median(cached)
        );
    }
}

#[test]
fn publishing_names_the_object_and_url_that_failed() {
    let Some(shared) = shared() else { return };
    let store = LoopbackStore::start();
    let options = PublishOptions {
        bundles: vec![shared.bundle.clone()],
        client: quick(),
        ..PublishOptions::new(store.url())
    };
    store.fail_always(Some(Fault::Status(500)));
    let error = publish(&options).unwrap_err().to_string();
    assert!(error.starts_with("cannot publish `"), "{error}");
    assert!(error.contains(&format!("{}/cas/", store.url())), "{error}");
    assert!(error.contains("answered 500 (2 attempts)"), "{error}");

    // Stored bytes that come back different are not "published".
    store.fail_always(None);
    // HEAD and PUT answered normally (a zero wait), then the read-back is wrong.
    let normally = Fault::Slow(Duration::ZERO);
    store.fail_next([normally.clone(), normally, Fault::WrongBytes]);
    let error = publish(&options).unwrap_err().to_string();
    assert!(error.contains("failed verification"), "{error}");
}
