//! The build farm: `dev bundle-kernels --farm` on a real sccache-dist farm, which `ci/farm run`
//! starts on 127.0.0.1 (a scheduler, two build servers, the client daemon) and names in
//! `KWHEEL_SCCACHE` and `SCCACHE_SERVER_UDS`. Without a farm these tests skip, unless
//! `KWHEEL_REQUIRE_FARM=1` (which `ci/test` sets where it starts one).
//!
//! Each library is built twice from an empty build cache, here and through the farm, and the
//! two bundles must be the same byte for byte. A clean farm build ([`assert_all_on_the_farm`])
//! ran every compile it sent on the farm: no stage ran here (`local_stages`, `dist_errors`),
//! no compile failed there and was built here, none was answered from sccache's cache; what
//! stayed here stayed by design (PTX outputs and line tables, counted by reason; NVRTC never
//! reaches the farm). The daemon's statistics are one count for every build it serves, so the
//! builds take turns ([`FARM_TURN`]).
//!
//! `KWHEEL_FARM_FAULT=1` (a farm of its own, since it stops a server) selects the fault test.

use super::*;

use std::collections::BTreeMap;
use std::sync::Mutex;

use bundler::farm::{FARM_FAILED, KEPT_LINE_TABLES, KEPT_PTX};

/// Held by a build whose farm statistics are checked: the daemon counts for all builds at once.
static FARM_TURN: Mutex<()> = Mutex::new(());

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

/// Builds `library` (its kernels `only`, else all) with `--farm` into `dir/farm` from an empty
/// build cache (every target compiles), and here into `dir/local` from another; asserts the two
/// bundles are the same file for file, byte for byte, and returns the farm build's JSON report.
fn build_both(dir: &Path, library: &Path, only: Option<&str>) -> serde_json::Value {
    let build = |out: &str, farm: bool| {
        let mut command = kwheel();
        command.args(["dev", "bundle-kernels", "--quiet", "--json"]);
        if let Some(kernels) = only {
            command.args(["--only", kernels]);
        }
        // Two jobs at a time, what two build servers of this size take at once (more would
        // leave stages waiting for room, and sccache then runs them here); no remote cache
        // from the environment or the user's configuration, which would answer the compiles.
        command
            .arg("--manifest")
            .arg(library.join("kernels.toml"))
            .arg("--out")
            .arg(dir.join(out))
            .arg("--cache-dir")
            .arg(dir.join(format!("{out}-cache")))
            .args(["--jobs", "2"])
            .env_remove("KWHEEL_REMOTE_CACHE")
            .env("XDG_CONFIG_HOME", dir.join("no-config"));
        if farm {
            command.arg("--farm");
        }
        let started = std::time::Instant::now();
        let output = command.output().unwrap();
        assert!(output.status.success(), "{out}: {}", text(&output));
        eprintln!("{} ({out}): {:?}", library.display(), started.elapsed());
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

/// Asserts that a farm build's `report` ran on the farm all it sent: no stage here, no
/// distribution error, no compile failed there and built here, no cache hit, and nothing kept
/// here but by design. Returns the stages each server ran.
fn assert_all_on_the_farm(report: &serde_json::Value) -> BTreeMap<String, u64> {
    let farm = &report["farm"];
    let sent = farm["sent"].as_u64().unwrap();
    assert!(sent > 0, "{farm:#}");
    let stats = &farm["stats"];
    assert_eq!(stats["dist_errors"], 0, "{farm:#}");
    assert_eq!(stats["local_stages"], 0, "{farm:#}");
    assert_eq!(stats["cache_hits"], 0, "{farm:#}");
    let kept = farm["kept_local"].as_object().unwrap();
    assert!(
        !kept.contains_key(FARM_FAILED),
        "a compile failed on the farm and was built here: {farm:#}"
    );
    assert!(
        kept.keys()
            .all(|reason| [KEPT_PTX, KEPT_LINE_TABLES].contains(&reason.as_str())),
        "only what stays here by design stayed here: {farm:#}"
    );
    let servers: BTreeMap<String, u64> = stats["by_server"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(server, n)| (server.clone(), n.as_u64().unwrap()))
        .collect();
    // Each nvcc -cubin compile is two stages (cicc, ptxas); the route's ptxas is one.
    assert!(servers.values().sum::<u64>() >= sent, "{farm:#}");
    servers
}

/// The whole default library, built through the farm from an empty cache: the bundle equals a
/// local build byte for byte, every compile sent to the farm ran there, and every server ran
/// stages. Its cu130 `-cubin` compiles go to the farm, the wgmma GEMM's `sm_90a` one too (its
/// header insists on `__CUDA_ARCH_FEAT_SM90_ALL`); its `compute_90` PTX stays here by design,
/// and its cu129 targets are NVRTC's.
#[test]
fn the_default_library_builds_on_the_farm_as_it_builds_here() {
    let Some((_, pids)) = farm("the_default_library_builds_on_the_farm_as_it_builds_here") else {
        return;
    };
    if std::env::var("KWHEEL_FARM_FAULT").as_deref() == Ok("1") {
        return;
    }
    let _turn = FARM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let report = build_both(dir.path(), &library, None);
    let servers = assert_all_on_the_farm(&report);
    let farm = &report["farm"];
    assert_eq!(
        servers.len(),
        pids.len().max(1),
        "every server ran stages: {farm:#}"
    );
    assert!(servers.values().all(|n| *n > 0), "{farm:#}");
    // Every kernel for each of its cu130 cubin archs: 6 kernels on sm_90a, sm_100a and
    // sm_100f, the GEMM on sm_90a.
    assert!(farm["sent"].as_u64().unwrap() >= 19, "{farm:#}");
}

/// A real third-party kernel, causal-conv1d's forward kernel from its sdist (`ci/setup-thirdparty`),
/// as a torch extension for `sm_90a`, through the farm: the same bundle as a local build, and
/// its compile ran on the farm (one compile of about 20 s: one arch keeps the test short).
#[test]
fn causal_conv1d_forward_builds_on_the_farm_as_it_builds_here() {
    let test = "causal_conv1d_forward_builds_on_the_farm_as_it_builds_here";
    let Some(_) = farm(test) else {
        return;
    };
    if std::env::var("KWHEEL_FARM_FAULT").as_deref() == Ok("1") {
        return;
    }
    let Some(causal_conv1d) = testkit::thirdparty_library("causal-conv1d-1.5.2") else {
        return;
    };
    let Some(pin) = testkit::torch_pin() else {
        return;
    };
    let _turn = FARM_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // The library's own folder, as its setup.py compiles it.
    let library = dir.path().join("causal-conv1d");
    copy_tree(&causal_conv1d.join("csrc"), &library.join("csrc"), &[]);
    std::fs::write(
        library.join("kernels.toml"),
        format!(
            "[library]\npackage = \"causal-conv1d-kernels\"\narchs = [\"sm_90a\"]\n\
             cuda-builds = [\"cu130\"]\ntorch = \"{pin}\"\ncxx-std = \"c++17\"\n\
             [kernels.causal_conv1d_fwd]\nsources = [\"csrc/causal_conv1d_fwd.cu\"]\ntorch = true\n\
             entries = [\"causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, at::Half, at::Half>>\"]\n"
        ),
    )
    .unwrap();
    let report = build_both(dir.path(), &library, None);
    assert_all_on_the_farm(&report);
    let farm = &report["farm"];
    assert_eq!(farm["sent"], 1, "{farm:#}");
    assert!(
        farm["kept_local"].as_object().unwrap().is_empty(),
        "{farm:#}"
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
        Some("swiglu,layernorm_bf16,wgmma_matmul_bf16,sigmoid_gate,masked_softmax_pair_bias"),
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
