//! A remote build cache that answers a key with a cubin that is not the key's (another
//! toolkit's or another target's, with the same entry names) is refused: a miss, counted as
//! refused and never as a hit, compiled here, and kept out of the local cache and the bundle.

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(workspace().join("prebuilt/tests/fixtures/cubin").join(name)).unwrap()
}

/// Points every action-cache entry of `store` at `cubin`, stored under its own digest: what a
/// cache that lies about a key serves (the digest checks pass).
fn serve_instead(store: &LoopbackStore, cubin: &[u8]) {
    let digest = prebuilt::key::sha256_hex(cubin);
    store.insert(&format!("/cas/{digest}"), cubin);
    let entry = format!(
        r#"{{"outputFiles":[{{"path":"k/cu130/sm_90a.cubin","digest":{{"hash":"{digest}","sizeBytes":"{}"}}}}]}}"#,
        cubin.len()
    );
    for path in store.paths().into_iter().filter(|p| p.starts_with("/ac/")) {
        store.insert(&path, entry.as_bytes());
    }
}

#[test]
fn remote_cache_cubins_of_another_toolkit_or_target_are_refused_and_compiled_here() {
    let store = LoopbackStore::start();
    // Three kernels built by a (fake) nvcc 13.0.88 for cu130/sm_90a into the remote cache.
    let library = fake_library(3);
    bundler::bundle_kernels_shared(&library.options("fill"), &remote(&store.url())).unwrap();
    let served =
        bundler::bundle_kernels_shared(&library.options("served"), &remote(&store.url())).unwrap();
    let stats = served.remote.unwrap();
    assert_eq!((stats.hits, stats.misses, stats.refused), (3, 0, 0));

    // Each of the same source, with the same entries: the cu129 NVRTC cubin for sm_90a (ABI 7,
    // e_version 129), NVRTC 12.9's sm_100a (its note says 12.9), nvcc 13.0's sm_100a (its
    // toolkit is right, its SM is not).
    let impostors = [
        "nvrtc129_sm_90a.cubin",
        "nvrtc129_sm_100a.cubin",
        "nvcc130_sm_100a.cubin",
    ];
    for (n, impostor) in impostors.into_iter().enumerate() {
        let impostor = fixture(impostor);
        serve_instead(&store, &impostor);
        let name = format!("impostor-{n}");
        let summary =
            bundler::bundle_kernels_shared(&library.options(&name), &remote(&store.url())).unwrap();
        assert_eq!(summary.compiled().len(), 3, "compiled here");
        assert_eq!(summary.from_remote(), 0);
        let stats = summary.remote.unwrap();
        assert_eq!((stats.hits, stats.misses, stats.refused), (0, 3, 3));
        assert!(stats.warnings >= 3);
        assert!(
            stats.to_string().contains("0 hits, 3 misses (3 refused)"),
            "{stats}"
        );
        assert_cache_holds_only(
            &library.dir.path().join(&name).join("cache"),
            &library.cubin,
        );
        let digest = prebuilt::key::sha256_hex(&library.cubin);
        for record in summary.index.kernels.values() {
            for variant in &record.variants {
                assert_eq!(variant.artifact.digest, digest);
            }
        }
    }
}
