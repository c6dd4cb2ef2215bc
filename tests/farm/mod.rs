//! The build farm: `dev bundle-kernels --farm` on a real sccache-dist farm, which `ci/farm run`
//! starts on 127.0.0.1 (a scheduler, two build servers, the client daemon) and names in
//! `KWHEEL_SCCACHE` and `SCCACHE_SERVER_UDS`. Without a farm these tests skip, unless
//! `KWHEEL_REQUIRE_FARM=1` (which `ci/test` sets where it starts one).
//!
//! `KWHEEL_FARM_FAULT=1` (a farm of its own, since it stops a server) selects the fault test.

use super::*;

use std::collections::BTreeMap;

/// The farm's environment, or `None` (the test skips, or fails under `KWHEEL_REQUIRE_FARM=1`).
fn farm(test: &str) -> Option<(String, Vec<String>)> {
    match (
        std::env::var("KWHEEL_SCCACHE"),
        std::env::var("SCCACHE_SERVER_UDS"),
    ) {
        (Ok(sccache), Ok(_)) => {
            let pids = std::env::var("KWHEEL_FARM_PIDS").unwrap_or_default();
            Some((
                sccache,
                pids.split_whitespace().map(str::to_owned).collect(),
            ))
        }
        _ if std::env::var("KWHEEL_REQUIRE_FARM").as_deref() == Ok("1") => {
            panic!("KWHEEL_REQUIRE_FARM=1 but no farm (`ci/farm run -- ...` starts one)")
        }
        _ => {
            testkit::skipped(&format!("{test}: no build farm (`ci/farm run` starts one)"));
            None
        }
    }
}

/// Every file of a bundle folder, by relative path, with its bytes.
fn files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_type().is_file())
        .map(|entry| {
            let relative = entry.path().strip_prefix(root).unwrap().to_path_buf();
            (relative, std::fs::read(entry.path()).unwrap())
        })
        .collect()
}

/// Builds `library` with `--farm` into `dir/farm` from an empty build cache (every target
/// compiles), and here into `dir/local` from another; returns the farm build's JSON report.
fn build_both(dir: &Path, library: &Path, kernels: &str) -> serde_json::Value {
    let build = |out: &str, farm: bool| {
        let mut command = kwheel();
        command
            .args([
                "dev",
                "bundle-kernels",
                "--quiet",
                "--json",
                "--only",
                kernels,
            ])
            .arg("--manifest")
            .arg(library.join("kernels.toml"))
            .arg("--out")
            .arg(dir.join(out))
            .arg("--cache-dir")
            .arg(dir.join(format!("{out}-cache")));
        if farm {
            command.arg("--farm");
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{out}: {}", text(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let local = build("local", false);
    assert!(local.get("farm").is_none(), "{local:#}");
    let report = build("farm", true);
    let (local_files, farm_files) = (files(&dir.join("local")), files(&dir.join("farm")));
    assert_eq!(
        local_files.keys().collect::<Vec<_>>(),
        farm_files.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &local_files {
        assert!(
            farm_files[path] == *bytes,
            "{} differs between the local and the farm build",
            path.display()
        );
    }
    report
}

/// Kernels of the default library, built through the farm from empty caches: the bundle
/// equals a local build byte for byte, and every
/// compile sent to the farm ran there: every server ran stages, none fell back here, none
/// was answered from a cache. PTX outputs stay here by design and are counted as such.
#[test]
fn a_farm_build_equals_a_local_build_byte_for_byte() {
    let Some((_, pids)) = farm("a_farm_build_equals_a_local_build_byte_for_byte") else {
        return;
    };
    if std::env::var("KWHEEL_FARM_FAULT").as_deref() == Ok("1") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let report = build_both(
        dir.path(),
        &library,
        "swiglu,layernorm_bf16,sigmoid_gate,masked_softmax_pair_bias",
    );
    let farm = &report["farm"];
    assert!(farm["sent"].as_u64().unwrap() > 0, "{farm:#}");
    let stats = &farm["stats"];
    assert_eq!(stats["dist_errors"], 0, "{farm:#}");
    assert_eq!(stats["local_stages"], 0, "{farm:#}");
    assert_eq!(stats["cache_hits"], 0, "{farm:#}");
    let servers = stats["by_server"].as_object().unwrap();
    assert_eq!(
        servers.len(),
        pids.len().max(1),
        "every server ran stages: {farm:#}"
    );
    assert!(
        servers.values().all(|n| n.as_u64().unwrap() > 0),
        "{farm:#}"
    );
    // Each nvcc -cubin compile is two stages (cicc, ptxas); the route's ptxas is one.
    let stages: u64 = servers.values().map(|n| n.as_u64().unwrap()).sum();
    assert!(stages >= farm["sent"].as_u64().unwrap(), "{farm:#}");
    let kept = farm["kept_local"].as_object().unwrap();
    assert!(
        kept.keys().all(|reason| reason.contains("PTX")),
        "only PTX outputs stay here: {farm:#}"
    );
}

/// A build server stopped while the build runs: the build still completes, its bundle equals
/// a local build, and the report says what happened (stages the farm failed, run here).
#[test]
fn a_build_survives_a_server_that_dies() {
    let Some((sccache, pids)) = farm("a_build_survives_a_server_that_dies") else {
        return;
    };
    if std::env::var("KWHEEL_FARM_FAULT").as_deref() != Ok("1") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    // The first server stops as soon as the farm has run a stage of this build.
    let victim = pids.first().cloned().expect("the farm's server pids");
    let stopper = std::thread::spawn(move || {
        for _ in 0..600 {
            let output = Command::new(&sccache)
                .args(["--show-stats", "--stats-format", "json"])
                .output()
                .unwrap();
            let json: serde_json::Value =
                serde_json::from_slice(&output.stdout).unwrap_or_default();
            let stages: u64 = json["stats"]["dist_compiles"]
                .as_object()
                .map_or(0, |m| m.values().filter_map(|n| n.as_u64()).sum());
            if stages > 0 {
                Command::new("kill").args(["-9", &victim]).status().unwrap();
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    });
    let report = build_both(
        dir.path(),
        &library,
        "swiglu,layernorm_bf16,wgmma_matmul_bf16,sigmoid_gate,masked_softmax_pair_bias",
    );
    assert!(stopper.join().unwrap(), "no stage ran on the farm");
    let farm = &report["farm"];
    let stats = &farm["stats"];
    assert_eq!(stats["cache_hits"], 0, "{farm:#}");
    // What the server had in hand failed and ran here, or the server was already idle: either
    // way every target built (the bundles are equal), and the report adds up.
    let failed = stats["dist_errors"].as_u64().unwrap();
    let local = stats["local_stages"].as_u64().unwrap();
    assert!(failed <= local, "{farm:#}");
    eprintln!("fault test: {farm:#}");
}
