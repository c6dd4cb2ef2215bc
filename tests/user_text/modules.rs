//! Snapshots of what a user reads of an extension module: `dev explain` of its key (and what
//! changed since a bundle), `dev coverage` of its fatbin's archs on a device and a fleet, and
//! `bundle list --json`. The module is the stable-ABI fixture (`testkit/fixtures/stable_module`)
//! built into a bundle with the cu130 nvcc, the host compiler and the cached torch.

use super::*;

/// The fixture library copied into a fresh folder and bundled into `<folder>/bundle`, as
/// (folder, manifest, bundle); `None` (said) without the toolchains or torch.
fn module_bundle() -> Option<(tempfile::TempDir, String, String)> {
    let dir = folder_with_toolchains()?;
    if bundler::torch::TorchHeaders::find().is_err() {
        testkit::missing("no torch (`bash ci/setup-torch` installs the pinned one)");
        return None;
    }
    testkit::copy_tree(
        &workspace().join("testkit/fixtures/stable_module"),
        dir.path(),
        &[],
    );
    let manifest = dir.path().join("kernels.toml").display().to_string();
    let bundle = dir.path().join("bundle").display().to_string();
    let output = kwheel()
        .args(["dev", "bundle-kernels", "--quiet", "--manifest", &manifest])
        .args(["--out", &bundle])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    Some((dir, manifest, bundle))
}

/// [`settings`], plus what changes with the machine: torch's folder, the host compiler's
/// version, the CPU, and a module's sizes.
fn module_settings() -> insta::Settings {
    let mut settings = settings();
    let torch = bundler::torch::TorchHeaders::find().unwrap().package;
    let escaped: String = torch
        .display()
        .to_string()
        .chars()
        .flat_map(
            |c| match c.is_ascii_alphanumeric() || c == '/' || c == '_' {
                true => vec![c],
                false => vec!['\\', c],
            },
        )
        .collect();
    settings.add_filter(&escaped, "[TORCH]");
    settings.add_filter(r"g\+\+ \([^)]*\) [0-9.]+", "g++ [VERSION]");
    settings.add_filter(std::env::consts::ARCH, "[CPU]");
    settings.add_filter(r#""size": \d+"#, r#""size": [SIZE]"#);
    settings.add_filter(r#""stored_size": \d+"#, r#""stored_size": [STORED]"#);
    settings
}

/// `dev explain` of a module: every unit's include tree, every key input and each CUDA
/// build's key, unchanged against the bundle just built; after a header edit, what changed;
/// and a name that is neither a kernel nor a module.
#[test]
fn dev_explain_of_an_extension_module() {
    let Some((dir, manifest, bundle)) = module_bundle() else {
        return;
    };
    let settings = module_settings();
    let explain = ["dev", "explain", "_C", "--manifest", &manifest, "--against"];
    let text = session(&[&explain[..], &[&bundle]].concat());
    settings.bind(|| insta::assert_snapshot!("dev_explain_module", text));

    let header = dir.path().join("csrc/axpby.h");
    let mut source = std::fs::read_to_string(&header).unwrap();
    source.push_str("// edited\n");
    std::fs::write(&header, source).unwrap();
    let text = session(&[&explain[..], &[&bundle]].concat());
    // The tree and the inputs are the snapshot above; the keys and the changes follow them.
    let (head, tail) = text.split_once("\ntargets:\n").unwrap();
    let head = head.lines().take(2).collect::<Vec<_>>().join("\n");
    let text = format!("{head}\n…\ntargets:\n{tail}");
    settings.bind(|| insta::assert_snapshot!("dev_explain_module_changed", text));

    let text = session(&["dev", "explain", "_D", "--manifest", &manifest]);
    settings.bind(|| insta::assert_snapshot!("dev_explain_unknown_name", text));
}

/// `dev coverage` reports the module as `_C (module)` by the archs its fatbin holds: on a
/// device one covers, on one none does, and across a fleet; as text and as `--json`.
#[test]
fn dev_coverage_of_an_extension_module() {
    let Some((_dir, _manifest, bundle)) = module_bundle() else {
        return;
    };
    let settings = module_settings();
    let h100: &[&str] = &["--device", "sm_90", "--cuda", "13.0"];
    let a100: &[&str] = &["--device", "8.0", "--cuda", "13.0"];
    let old_torch: &[&str] = &["--device", "9.0", "--cuda", "13.0", "--torch", "2.10.0"];
    let fleet: &[&str] = &["--fleet", "H100,B200,B300,RTX-5090", "--cuda", "13.0"];
    for (name, query) in [
        ("dev_coverage_module_h100", h100),
        ("dev_coverage_module_a100", a100),
        ("dev_coverage_module_older_torch", old_torch),
        ("dev_coverage_module_fleet", fleet),
    ] {
        let args = [&["dev", "coverage", &bundle][..], query].concat();
        let text = session(&args);
        settings.bind(|| insta::assert_snapshot!(name, text));
        let json = session(&[&args[..], &["--json"]].concat());
        settings.bind(|| insta::assert_snapshot!(format!("{name}_json"), json));
    }
}

/// `bundle list --json` lists the module with its build, its skip and what each arch of its
/// fatbin holds.
#[test]
fn bundle_list_json_of_an_extension_module() {
    let Some((_dir, _manifest, bundle)) = module_bundle() else {
        return;
    };
    let text = session(&["bundle", "list", "--json", &bundle]);
    module_settings().bind(|| insta::assert_snapshot!("bundle_list_module_json", text));
}
