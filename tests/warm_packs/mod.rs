//! Warm packs end to end: a kernel the bundle has no cubin for is compiled by the JIT on
//! "machine A" (its own JIT cache, NVRTC 12.9 from the provisioned toolchains, a compute 8.9
//! device that no shipped `sm_90a`/`sm_100a` cubin fits), exported with `kwheel jit export`,
//! installed with `kwheel jit import` on "machine B" (another HOME and XDG cache, no compiler
//! anywhere the search looks, the JIT forbidden), where the loader plans and loads it from the
//! pack with its own provenance; a pack altered on the way is refused, naming the pack file and
//! the kernel. The GPU side is a fake behind the loader's `Device` seam that records the image
//! it is given; `prebuilt/tests/warm_pack.rs` launches the kernel on an H200.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prebuilt::compile::{toolchain_dir, ToolkitLayout};
use prebuilt::jit::pack::{PackIndex, PACK_FILE};
use prebuilt::jit::CompilerSearch;
use prebuilt::registry::{Provenance, ProvenanceKind};
use prebuilt::{JitPolicy, LoadError, Registry, RegistryOptions, Status};

use testkit::fixtures::{no_compiler, FakeDevice};

use super::support::*;

const KERNEL: &str = "swiglu";

/// Compute 8.9 behind a CUDA 12.9 driver: the bundle's cubins are all `sm_90a`/`sm_100a`, so
/// only a JIT result (or a pack's) fits. Keeps every image it is asked to load.
fn ada() -> Arc<FakeDevice> {
    FakeDevice::new((8, 9), "12.9")
}

fn options(jit: JitPolicy, jit_cache: &Path, compilers: CompilerSearch) -> RegistryOptions {
    RegistryOptions {
        cuda: Some("cu129".parse().unwrap()),
        torch: None,
        jit,
        jit_cache: jit_cache.to_path_buf(),
        compilers,
        device: 0,
        ..RegistryOptions::default()
    }
}

/// `kwheel jit …` as machine B runs it: its own HOME and cache, no JIT cache variable, no
/// compiler on any path the search reads.
fn on_machine_b(b: &Path) -> std::process::Command {
    let mut command = kwheel();
    command
        .arg("jit")
        .env("HOME", b.join("home"))
        .env("XDG_CACHE_HOME", b.join("cache"))
        .env("PATH", "/usr/bin:/bin")
        .env("CUDA_HOME", b.join("no-cuda"))
        .env("AF3_KERNELS_JIT_FALLBACK", "0");
    for variable in [
        "KWHEEL_JIT_CACHE",
        "KWHEEL_NVRTC",
        "KWHEEL_SITE_PACKAGES",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CUDA_PATH",
    ] {
        command.env_remove(variable);
    }
    command
}

struct Machines {
    _dir: tempfile::TempDir,
    root: PathBuf,
    bundle: PathBuf,
    pack: PathBuf,
    /// The cubin machine A's JIT compiled.
    compiled: Vec<u8>,
}

/// `root/bundle`: the default library's bundle of `swiglu` alone, with its own build cache.
fn bundle_kernel(root: &Path) -> PathBuf {
    let bundle = root.join("bundle");
    let output = bundle_kernels(&bundle, &root.join("build-cache"))
        .args(["--only", KERNEL])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    bundle
}

/// `kwheel jit export --package <bundle> --out <out> --jit-cache <jit_cache>`.
fn jit_export(bundle: &Path, out: &Path, jit_cache: &Path) -> std::process::Command {
    let mut command = kwheel();
    command
        .args(["jit", "export", "--package"])
        .arg(bundle)
        .arg("--out")
        .arg(out)
        .arg("--jit-cache")
        .arg(jit_cache);
    command
}

/// Machine A: bundle `swiglu`, load it on the 8.9 device (the JIT compiles it into A's cache),
/// export the pack.
fn machine_a() -> Option<Machines> {
    if !have_toolchains() {
        return None;
    }
    let nvrtc = ToolkitLayout::scan(&toolchain_dir("cu129".parse().unwrap())).nvrtc?;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let bundle = bundle_kernel(&root);

    let a_cache = root.join("a/jit");
    let search = CompilerSearch {
        nvrtc: Some(nvrtc),
        ..no_compiler(&root)
    };
    let device = ada();
    let registry = Registry::open_on(
        &bundle,
        options(JitPolicy::Allowed, &a_cache, search),
        device.clone(),
        None,
    )
    .unwrap();
    let kernel = load(&registry);
    assert_eq!(kernel.provenance().kind(), ProvenanceKind::JitCompiled);
    assert_eq!(kernel.variant(), "cu129/sm_89");
    let compiled = device.loaded()[0].clone();

    let pack = root.join("pack");
    let output = jit_export(&bundle, &pack, &a_cache)
        .arg("--json")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["entries"], serde_json::json!(["swiglu cu129/sm_89"]));
    assert_eq!(report["skipped"], serde_json::json!([]));
    let settings = snapshot_settings(&root);
    settings.bind(|| insta::assert_snapshot!("jit_export_json", rendered(&output)));
    // The same export as a user reads it.
    let again = jit_export(&bundle, &root.join("pack-text"), &a_cache)
        .output()
        .unwrap();
    settings.bind(|| insta::assert_snapshot!("jit_export", rendered(&again)));
    Some(Machines {
        _dir: dir,
        root,
        bundle,
        pack,
        compiled,
    })
}

fn b_cache(b: &Path) -> PathBuf {
    b.join("cache/kwheel/jit")
}

impl Machines {
    /// `kwheel jit import <pack> --package <the bundle>` on machine B (rooted at `b`).
    fn import_on_b(&self, b: &Path, pack: &Path) -> std::process::Output {
        on_machine_b(b)
            .arg("import")
            .arg(pack)
            .arg("--package")
            .arg(&self.bundle)
            .output()
            .unwrap()
    }
}

/// The loader as machine B (rooted at `b`) opens `bundle`: its own JIT cache, the JIT off, no
/// compiler, `device` for the GPU.
fn on_machine_b_registry(bundle: &Path, b: &Path, device: Arc<FakeDevice>) -> Registry {
    Registry::open_on(
        bundle,
        options(JitPolicy::Disabled, &b_cache(b), no_compiler(b)),
        device,
        None,
    )
    .unwrap()
}

/// `KERNEL` loaded, or a panic with the whole error chain.
fn load(registry: &Registry) -> prebuilt::Kernel {
    registry
        .load(KERNEL)
        .unwrap_or_else(|error| panic!("{}", prebuilt::error_chain(&error)))
}

#[test]
fn a_jit_only_kernel_exported_on_one_machine_loads_from_the_pack_on_another_without_a_compiler() {
    let Some(machines) = machine_a() else { return };
    let b = machines.root.join("b");

    // Before the import machine B has nothing for this GPU, and may not compile.
    let before = on_machine_b_registry(&machines.bundle, &b, ada());
    assert!(matches!(before.load(KERNEL), Err(LoadError::NoFit { .. })));

    let output = machines.import_on_b(&b, &machines.pack);
    assert!(output.status.success(), "{}", text(&output));
    let snapshots = snapshot_settings(&machines.root);
    snapshots.bind(|| insta::assert_snapshot!("jit_import", rendered(&output)));
    let installed = b_cache(&b).join("packs-v1/af3-kernels");
    assert!(
        stdout(&output).contains(&installed.display().to_string()),
        "{}",
        text(&output)
    );

    let device = ada();
    let registry = on_machine_b_registry(&machines.bundle, &b, device.clone());
    let Status::Available {
        variant,
        provenance,
        reason,
        location,
    } = &registry.status()[KERNEL]
    else {
        panic!("{:?}", registry.status()[KERNEL]);
    };
    assert_eq!(variant, "cu129/sm_89");
    assert_eq!(*provenance, ProvenanceKind::Pack);
    assert_eq!(*location, None);
    assert!(
        reason.starts_with("sm_89 cubin for an 8.9 device, cu129, driver 12.9")
            && reason.contains(&format!("; from the warm pack {}/", installed.display())),
        "{reason}"
    );

    let kernel = load(&registry);
    let Provenance::Pack { variant, key, pack } = kernel.provenance() else {
        panic!("{}", kernel.provenance());
    };
    assert_eq!(variant, "cu129/sm_89");
    assert!(pack.starts_with(&installed), "{}", pack.display());
    assert_eq!(
        kernel.trace_label(),
        format!("kwheel:swiglu cu129/sm_89 pack {} cuda:0", &key[..12])
    );
    assert_eq!(
        device.loaded().as_slice(),
        std::slice::from_ref(&machines.compiled),
        "machine B loads the very cubin machine A compiled"
    );
    assert!(
        !b_cache(&b).join("kernels-v1").exists(),
        "nothing was compiled on machine B"
    );

    // Importing the same pack again changes nothing.
    let again = machines.import_on_b(&b, &machines.pack);
    assert!(
        stdout(&again).starts_with("already installed:"),
        "{}",
        text(&again)
    );
    snapshots.bind(|| insta::assert_snapshot!("jit_import_again", rendered(&again)));
}

/// `kwheel jit import --json` on a machine without the pack, then again: the whole report,
/// `already` false and then true, the installed folder under the machine's own cache.
#[test]
fn jit_import_json_reports_the_installed_pack_and_then_that_it_was_already_there() {
    let Some(machines) = machine_a() else { return };
    let b = machines.root.join("b");
    let import = || {
        on_machine_b(&b)
            .arg("import")
            .arg(&machines.pack)
            .arg("--package")
            .arg(&machines.bundle)
            .arg("--json")
            .output()
            .unwrap()
    };
    let snapshots = snapshot_settings(&machines.root);
    let first = import();
    assert!(first.status.success(), "{}", text(&first));
    let report: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(report["already"], false, "{report}");
    snapshots.bind(|| insta::assert_snapshot!("jit_import_json", rendered(&first)));
    let again = import();
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["already"], true, "{report}");
    snapshots.bind(|| insta::assert_snapshot!("jit_import_again_json", rendered(&again)));
}

/// A copy of the pack with `edit` applied to its files.
fn altered(machines: &Machines, name: &str, edit: impl FnOnce(&Path, &mut PackIndex)) -> PathBuf {
    let copy = machines.root.join(name);
    copy_tree(&machines.pack, &copy, &[]);
    let path = copy.join(PACK_FILE);
    let mut index: PackIndex = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&copy, &mut index);
    std::fs::write(&path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    copy
}

fn artifact(index: &PackIndex) -> String {
    index.kernels[KERNEL].variants[0].artifact.path.clone()
}

#[test]
fn a_tampered_pack_is_refused_naming_the_pack_file_and_kernel() {
    let Some(machines) = machine_a() else { return };
    let b = machines.root.join("b");
    let import = |pack: &Path| machines.import_on_b(&b, pack);

    // Other bytes under the recorded digest: the artifact no longer verifies.
    let flipped = altered(&machines, "flipped", |dir, index| {
        let stored = dir.join(artifact(index));
        let cubin = zstd::decode_all(std::fs::read(&stored).unwrap().as_slice()).unwrap();
        let mut cubin = cubin;
        let last = cubin.len() - 1;
        cubin[last] ^= 0xff;
        std::fs::write(&stored, zstd::encode_all(cubin.as_slice(), 3).unwrap()).unwrap();
    });
    let message = failure(&import(&flipped), VERIFICATION);
    assert!(
        message.contains(&flipped.join(PACK_FILE).display().to_string())
            && message
                .contains("the cubin of `swiglu` (cu129/sm_89) is not the one its entry names")
            && message.contains("sha256"),
        "{message}"
    );

    // A key the shipped sources do not give.
    let rekeyed = altered(&machines, "rekeyed", |_, index| {
        let variant = &mut index.kernels.get_mut(KERNEL).unwrap().variants[0];
        variant.key = "0".repeat(64);
    });
    let message = failure(&import(&rekeyed), VERIFICATION);
    assert!(
        message.contains(&rekeyed.join(PACK_FILE).display().to_string())
            && message.contains("its `swiglu` (cu129/sm_89) has the key 0000")
            && message.contains("but the package's shipped sources"),
        "{message}"
    );

    // Another kernel's entries recorded for this one: the cubin has no such entry.
    let renamed = altered(&machines, "renamed", |_, index| {
        let variant = &mut index.kernels.get_mut(KERNEL).unwrap().variants[0];
        variant.functions[0].symbol = "layernorm_bf16".into();
    });
    let message = failure(&import(&renamed), VERIFICATION);
    assert!(
        message.contains("the cubin of `swiglu` (cu129/sm_89)")
            && message.contains("layernorm_bf16"),
        "{message}"
    );
    assert!(
        !b_cache(&b).join("packs-v1").join("af3-kernels").exists()
            || std::fs::read_dir(b_cache(&b).join("packs-v1/af3-kernels"))
                .unwrap()
                .next()
                .is_none(),
        "a refused pack installs nothing"
    );

    // A pack altered after it was installed is refused by the loader, also with the JIT off.
    let output = import(&machines.pack);
    assert!(output.status.success(), "{}", text(&output));
    let installed = std::fs::read_dir(b_cache(&b).join("packs-v1/af3-kernels"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let index: PackIndex =
        serde_json::from_slice(&std::fs::read(installed.join(PACK_FILE)).unwrap()).unwrap();
    let stored = installed.join(artifact(&index));
    let mut cubin = zstd::decode_all(std::fs::read(&stored).unwrap().as_slice()).unwrap();
    cubin[0] ^= 0xff;
    std::fs::write(&stored, zstd::encode_all(cubin.as_slice(), 3).unwrap()).unwrap();
    let device = ada();
    let registry = on_machine_b_registry(&machines.bundle, &b, device.clone());
    let error = registry.load(KERNEL).unwrap_err();
    let message = prebuilt::error_chain(&error);
    assert!(matches!(error, LoadError::Pack(_)), "{message}");
    assert!(
        message.contains(&installed.join(PACK_FILE).display().to_string())
            && message.contains("`swiglu` (cu129/sm_89)"),
        "{message}"
    );
    assert!(device.loaded().is_empty(), "nothing was loaded");
}

#[test]
fn export_without_jit_results_says_what_it_passed_over() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_kernel(dir.path());
    let output = jit_export(&bundle, &dir.path().join("pack"), &dir.path().join("empty"))
        .output()
        .unwrap();
    let message = failure(&output, NOT_FOUND);
    assert!(
        message.contains("holds no JIT result of `af3-kernels` to export"),
        "{message}"
    );
    assert!(!dir.path().join("pack").exists());
}

#[test]
fn a_pack_added_to_a_wheel_ships_verified_and_loads_from_the_installed_bundle() {
    let Some(machines) = machine_a() else { return };
    let wheels = machines.root.join("wheels");
    let output = kwheel()
        // The whole library's bundle (from the shared build cache), built first: the wheel
        // ships every kernel, and the pack is checked against its `swiglu`.
        .args(["dev", "build-wheel", "--quiet", "--bundle"])
        .arg(machines.root.join("full"))
        .arg("--add-pack")
        .arg(&machines.pack)
        .arg("--out")
        .arg(&wheels)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .expect("a wheel");
    let verify = kwheel()
        .args(["wheel", "verify"])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", text(&verify));

    // Installed as pip unpacks it, on machine B, with no import and no compiler.
    let site = machines.root.join("site");
    let unpacked = std::process::Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&site)
        .output()
        .unwrap();
    assert!(unpacked.status.success(), "{}", text(&unpacked));
    let bundle = site.join("af3_kernels/_prebuilt");
    let packs: Vec<PathBuf> = std::fs::read_dir(bundle.join("packs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(packs.len(), 1, "{packs:?}");
    assert!(packs[0].join(PACK_FILE).is_file());

    let b = machines.root.join("b");
    let device = ada();
    let registry = on_machine_b_registry(&bundle, &b, device.clone());
    let kernel = load(&registry);
    let Provenance::Pack { variant, pack, .. } = kernel.provenance() else {
        panic!("{}", kernel.provenance());
    };
    assert_eq!(variant, "cu129/sm_89");
    assert!(pack.starts_with(&bundle), "{}", pack.display());
    assert_eq!(
        device.loaded().as_slice(),
        std::slice::from_ref(&machines.compiled),
        "the wheel's pack holds the very cubin machine A compiled"
    );
}

#[test]
fn a_crafted_pack_cannot_choose_where_it_installs_or_swap_its_index() {
    let Some(machines) = machine_a() else { return };
    let b = machines.root.join("b");
    // Without `--package` the pack's own package name picks the bundle and the folder.
    let import_as = |pack: &Path, package: bool| {
        let mut command = on_machine_b(&b);
        command
            .arg("import")
            .arg(pack)
            .arg("--jit-cache")
            .arg(b_cache(&b));
        if package {
            command.arg("--package").arg(&machines.bundle);
        }
        command.output().unwrap()
    };
    let import = |pack: &Path| import_as(pack, true);
    let elsewhere = machines.root.join("elsewhere/b");
    let pathed = altered(&machines, "pathed", |_, index| {
        index.package = elsewhere.display().to_string();
    });
    let message = failure(&import_as(&pathed, false), VERIFICATION);
    assert!(message.contains("is not a distribution name"), "{message}");
    assert!(!machines.root.join("elsewhere").exists());
    assert!(!machines.root.join("elsewhere".to_lowercase()).exists());

    // One entry listed twice (the work of verifying a pack is bounded by distinct entries).
    let twice = altered(&machines, "twice", |_, index| {
        let record = index.kernels.get_mut(KERNEL).unwrap();
        let again = record.variants[0].clone();
        record.variants.push(again);
    });
    let message = failure(&import(&twice), VERIFICATION);
    assert!(message.contains("is listed twice"), "{message}");

    // No entries named: nothing would be checked against the kernel's entry points.
    let anonymous = altered(&machines, "anonymous", |_, index| {
        index.kernels.get_mut(KERNEL).unwrap().variants[0]
            .functions
            .clear();
    });
    let message = failure(&import(&anonymous), VERIFICATION);
    assert!(message.contains("not the kernel's"), "{message}");

    // A `pack.json` that is a link out of the pack is refused, like an artifact's.
    let linked = altered(&machines, "linked", |_, _| {});
    let outside = machines.root.join("outside.json");
    std::fs::rename(linked.join(PACK_FILE), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join(PACK_FILE)).unwrap();
    let output = import(&linked);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("leads out"), "{}", text(&output));
    assert!(
        !b_cache(&b).join("packs-v1").exists()
            || std::fs::read_dir(b_cache(&b).join("packs-v1/af3-kernels"))
                .map_or(true, |mut dir| dir.next().is_none()),
        "a refused pack installs nothing"
    );
}
