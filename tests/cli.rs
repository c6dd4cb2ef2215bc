//! The `kwheel` binary end to end: the README's commands, every verb, and the errors a user
//! meets, on the embedded library with the real toolchains.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kwheel() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kwheel"));
    command.current_dir(workspace());
    command
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Whether the toolchains are installed; without them a test skips with the reason, unless
/// `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI), where it fails.
fn have_toolchains() -> bool {
    let output = kwheel().arg("toolchains").output().unwrap();
    if output.status.success() {
        return true;
    }
    if std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() == Ok("1") {
        panic!(
            "toolchains required but missing:\n{}{}",
            stdout(&output),
            stderr(&output)
        );
    }
    eprintln!("skipped: no toolchains ({})", stdout(&output).trim());
    false
}

/// The shell commands of the README's "Set up" section, in order.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let section = readme
        .split("## Set up")
        .nth(1)
        .expect("README has a Set up section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut commands = Vec::new();
    let mut in_block = false;
    for line in section.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
        } else if in_block && !line.trim().is_empty() {
            commands.push(line.trim().to_owned());
        }
    }
    commands
}

#[test]
fn readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() {
    let commands = readme_commands();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(commands[0].contains("dev bundle-kernels"), "{commands:?}");
    // Every step of the README's test command is a line of .ci/run, in the same order.
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    let lines: Vec<&str> = ci.lines().map(str::trim).collect();
    let mut position = 0;
    for step in commands[1].split("&&").map(str::trim) {
        let found = lines[position..].iter().position(|line| *line == step);
        let found = found.unwrap_or_else(|| {
            panic!(".ci/run must run `{step}` (from the README's test command) in order:\n{ci}")
        });
        position += found + 1;
    }
}

#[test]
fn readme_main_command_bundles_the_embedded_library() {
    if !have_toolchains() {
        return;
    }
    let command = &readme_commands()[0];
    let output = Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(workspace())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{command}\n{}{}",
        stdout(&output),
        stderr(&output)
    );
    let bundle = prebuilt::Bundle::open(workspace().join("target/kwheel/_prebuilt")).unwrap();
    let index = bundle.index();
    assert!(index.kernels.len() >= 6);
    for (name, record) in &index.kernels {
        assert_eq!(record.variants.len() + record.skipped.len(), 4, "{name}");
        for variant in &record.variants {
            bundle.read_artifact(name, variant).unwrap();
        }
    }
}

#[test]
fn help_lists_every_command() {
    let output = kwheel().arg("--help").output().unwrap();
    let text = stdout(&output);
    for command in ["dev", "bundle", "toolchains"] {
        assert!(text.contains(command), "{text}");
    }
    let output = kwheel().args(["dev", "--help"]).output().unwrap();
    let text = stdout(&output);
    assert!(
        text.contains("bundle-kernels") && text.contains("explain"),
        "{text}"
    );
}

fn build_into(dir: &Path, extra: &[&str]) -> Output {
    kwheel()
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(dir.join("bundle"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn toolchains_lists_both_builds_with_compiler_and_version() {
    if !have_toolchains() {
        return;
    }
    let output = kwheel().arg("toolchains").output().unwrap();
    let text = stdout(&output);
    assert!(text.contains("cu129  nvrtc 12.9."), "{text}");
    assert!(text.contains("cu130  nvcc 13.0."), "{text}");
}

#[test]
fn missing_toolchain_names_the_build_and_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let output = kwheel()
        .env("KWHEEL_CUDA_CU129", dir.path().join("absent"))
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(
        text.contains("cu129") && text.contains("ci/setup"),
        "{text}"
    );
    assert!(!dir.path().join("out").exists());
}

#[test]
fn list_extract_and_explain_work_on_a_bundle() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = build_into(dir.path(), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("compiled"), "{}", stdout(&output));

    let output = kwheel()
        .args(["bundle", "list"])
        .arg(dir.path().join("bundle"))
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(text.starts_with("kernel"), "{text}");
    let rows: Vec<String> = text
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(rows.len(), 1 + 22 + 2, "{text}");
    assert!(
        rows.iter()
            .any(|r| r.starts_with("layernorm_bf16 cu129 sm_90a nvrtc 12.9.")),
        "{text}"
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with("wgmma_matmul_bf16 cu130 sm_100a - - - - declared:")),
        "{text}"
    );

    let extracted = dir.path().join("cubins");
    let output = kwheel()
        .args(["bundle", "extract"])
        .arg(dir.path().join("bundle"))
        .arg("--out")
        .arg(&extracted)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let cubin = std::fs::read(extracted.join("swiglu/cu130/sm_100a.cubin")).unwrap();
    let info = prebuilt::cubin::inspect_cubin(&cubin).unwrap();
    assert_eq!(info.sm, 100);
    assert!(!extracted
        .join("wgmma_matmul_bf16/cu130/sm_100a.cubin")
        .exists());

    // What would load on a B200 with CUDA 13.0, as a table and as JSON.
    let output = kwheel()
        .args(["dev", "coverage"])
        .arg(dir.path().join("bundle"))
        .args(["--device", "sm_100", "--cuda", "13.0", "--driver", "580.65"])
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    let row = |kernel: &str| {
        text.lines()
            .find(|line| line.starts_with(kernel))
            .map(|line| {
                line.split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
    };
    assert_eq!(
        row("swiglu").as_deref(),
        Some("swiglu cu130/sm_100a"),
        "{text}"
    );
    assert_eq!(
        row("wgmma_matmul_bf16").as_deref(),
        Some("wgmma_matmul_bf16 none"),
        "{text}"
    );
    assert!(text.contains("not built: declared"), "{text}");
    let output = kwheel()
        .args(["dev", "coverage"])
        .arg(dir.path().join("bundle"))
        .args(["--device", "8.6", "--cuda", "cu129", "--json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let kernels = json["kernels"].as_object().unwrap();
    assert_eq!(kernels.len(), 6);
    assert!(kernels.values().all(|k| k["loads"].is_null()), "{json}");

    let output = kwheel()
        .args(["dev", "explain", "swiglu", "--against"])
        .arg(dir.path().join("bundle"))
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(text.contains("swiglu/swiglu.cu"), "{text}");
    assert!(text.contains("include/af3/activations.cuh"), "{text}");
    assert!(text.contains("BLOCK_SIZE=256"), "{text}");
    assert!(text.contains("cu130/sm_90a  nvcc 13.0."), "{text}");
    assert!(text.contains("unchanged since the index"), "{text}");
}

#[test]
fn explain_against_names_the_edited_header() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let manifest = library.join("kernels.toml");
    let output = build_into(
        dir.path(),
        &["--manifest", manifest.to_str().unwrap(), "--only", "swiglu"],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let header = library.join("include/af3/activations.cuh");
    let text = std::fs::read_to_string(&header).unwrap() + "\n// edited\n";
    std::fs::write(&header, text).unwrap();
    let output = kwheel()
        .args([
            "dev",
            "explain",
            "swiglu",
            "--manifest",
            manifest.to_str().unwrap(),
            "--against",
        ])
        .arg(dir.path().join("bundle"))
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(text.contains("changed since the index:"), "{text}");
    assert!(
        text.contains("file include/af3/activations.cuh: content changed"),
        "{text}"
    );
    assert!(
        !text.contains("swiglu/swiglu.cu: content changed"),
        "{text}"
    );
}

fn copy_library(dir: &Path) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name == "reference" {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &to.join(&name));
            } else {
                std::fs::copy(entry.path(), to.join(&name)).unwrap();
            }
        }
    }
    let to = dir.join("kernels");
    copy(&workspace().join("kernels"), &to);
    to
}

#[test]
fn killed_build_leaves_nothing_half_written_and_the_next_run_continues() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut child = kwheel()
        .args(["dev", "bundle-kernels", "--quiet", "--jobs", "1", "--out"])
        .arg(dir.path().join("bundle"))
        .arg("--cache-dir")
        .arg(&cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for a few entries, then kill it in the middle of the next compile.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while cache_entries(&cache).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no cache entries appeared"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build finished before it could be killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    assert!(
        !dir.path().join("bundle").exists(),
        "no bundle from a killed run"
    );
    let entries = cache_entries(&cache);
    for entry in &entries {
        let bytes = std::fs::read(entry).unwrap();
        prebuilt::cubin::inspect_cubin(&bytes)
            .unwrap_or_else(|e| panic!("torn cache entry {}: {e}", entry.display()));
    }

    let output = build_into(dir.path(), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = stdout(&output);
    let from_cache = format!("{} from cache", entries.len());
    assert!(
        summary.contains(&from_cache),
        "expected `{from_cache}` in: {summary}"
    );
}

fn cache_entries(cache: &Path) -> Vec<PathBuf> {
    let mut entries = Vec::new();
    let Ok(shards) = std::fs::read_dir(cache.join("kernels-v1")) else {
        return entries;
    };
    for shard in shards.flatten() {
        for entry in std::fs::read_dir(shard.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "cubin") {
                entries.push(path);
            }
        }
    }
    entries
}

// ---- release check ---------------------------------------------------------------------

/// Runs `release check` on the library copy at `library`, with its bundle and wheels in `dir`.
fn release_check(dir: &Path, library: &Path, extra: &[&str]) -> (bool, serde_json::Value) {
    let output = kwheel()
        .args(["release", "check", "--json", "--manifest"])
        .arg(library.join("kernels.toml"))
        .arg("--bundle")
        .arg(dir.join("bundle"))
        .arg("--wheels")
        .arg(dir.join("wheels"))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(extra)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&output), stderr(&output)));
    (output.status.success(), json)
}

fn gate<'j>(json: &'j serde_json::Value, name: &str) -> &'j serde_json::Value {
    json["gates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no gate {name} in {json}"))
}

#[test]
fn release_check_passes_on_a_clean_tree_and_builds_only_what_is_missing() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let (passed, json) = release_check(dir.path(), &library, &[]);
    assert!(passed, "{json:#}");
    for name in [
        "version",
        "bundle",
        "keys",
        "cubins",
        "reproducible",
        "wheel",
        "install",
        "size",
    ] {
        assert_eq!(gate(&json, name)["status"], "pass", "{name}: {json:#}");
    }
    let gpu = &gate(&json, "gpu")["reason"];
    assert!(gpu.as_str().unwrap().starts_with("no GPU here"), "{json:#}");
    let built = json["built"].as_array().unwrap();
    assert_eq!(
        built.len(),
        3,
        "the bundle, the library wheel and the runtime wheel were missing: {json:#}"
    );
    let install = gate(&json, "install")["reason"].as_str().unwrap();
    assert!(
        install.contains("22 of 24 selections")
            && install.contains("2 refused only by a declared skip"),
        "{install}"
    );

    // The second run verifies what is there and builds nothing.
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(passed, "{json:#}");
    assert!(json["built"].as_array().unwrap().is_empty(), "{json:#}");
    assert_eq!(gate(&json, "publish")["status"], "skip", "{json:#}");

    // The optional publish gate, against the loopback store `.ci/run` starts.
    match std::env::var("KWHEEL_TEST_STORE") {
        Ok(store) => {
            let store = format!("{store}/release-check-{}", std::process::id());
            let (passed, json) =
                release_check(dir.path(), &library, &["--no-rebuild", "--publish", &store]);
            assert!(passed, "{json:#}");
            let publish = gate(&json, "publish")["reason"]
                .as_str()
                .unwrap()
                .to_owned();
            // 22 cubins (some identical ones stored once) and 2 wheels, all verified.
            assert!(publish.contains("verified by download"), "{publish}");
        }
        Err(_) if std::env::var("KWHEEL_REQUIRE_STORE").as_deref() == Ok("1") => {
            panic!("KWHEEL_REQUIRE_STORE=1 but KWHEEL_TEST_STORE is not set")
        }
        Err(_) => eprintln!("skipped the publish gate: no KWHEEL_TEST_STORE"),
    }

    // The text checklist: one line per gate with its mark.
    let output = kwheel()
        .args(["release", "check", "--no-rebuild", "--manifest"])
        .arg(library.join("kernels.toml"))
        .arg("--bundle")
        .arg(dir.path().join("bundle"))
        .arg("--wheels")
        .arg(dir.path().join("wheels"))
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(
        text.contains("✔ keys") && text.contains("release check passed"),
        "{text}"
    );
}

#[test]
fn release_check_names_the_kernel_and_file_edited_after_bundling() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let (passed, _) = release_check(dir.path(), &library, &[]);
    assert!(passed);
    let source = library.join("sigmoid_gate/sigmoid_gate.cu");
    let text = std::fs::read_to_string(&source).unwrap() + "\n// edited after bundling\n";
    std::fs::write(&source, text).unwrap();
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    let keys = gate(&json, "keys");
    assert_eq!(keys["status"], "fail");
    let reason = keys["reason"].as_str().unwrap();
    assert!(reason.contains("`sigmoid_gate`"), "{reason}");
    assert!(reason.contains("sigmoid_gate/sigmoid_gate.cu"), "{reason}");
    assert!(
        !reason.contains("`swiglu`"),
        "only the edited kernel: {reason}"
    );
    assert!(keys["fix"].as_str().unwrap().contains("bundle-kernels"));
}

#[test]
fn release_check_fails_gates_on_a_broken_tree_without_crashing() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());

    // A missing bundle with --no-rebuild.
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    assert_eq!(gate(&json, "bundle")["status"], "fail", "{json:#}");
    assert!(gate(&json, "bundle")["reason"]
        .as_str()
        .unwrap()
        .contains("no bundle"));

    let (passed, _) = release_check(dir.path(), &library, &[]);
    assert!(passed);

    // A wheel edited after building: same name, other bytes.
    let wheel = std::fs::read_dir(dir.path().join("wheels"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().contains("af3_kernels-"))
        .unwrap();
    let original = std::fs::read(&wheel).unwrap();
    let mut edited = original.clone();
    let middle = edited.len() / 2;
    edited[middle] ^= 0x5a;
    std::fs::write(&wheel, &edited).unwrap();
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    assert_eq!(gate(&json, "reproducible")["status"], "fail", "{json:#}");
    assert!(gate(&json, "reproducible")["reason"]
        .as_str()
        .unwrap()
        .contains("edited"));
    assert_eq!(gate(&json, "wheel")["status"], "fail", "{json:#}");
    std::fs::write(&wheel, &original).unwrap();

    // A corrupted artifact in the bundle.
    let bundle = prebuilt::Bundle::open(dir.path().join("bundle")).unwrap();
    let (kernel, record) = bundle.index().kernels.iter().next().unwrap();
    let artifact = dir
        .path()
        .join("bundle")
        .join(&record.variants[0].artifact.path);
    let mut bytes = std::fs::read(&artifact).unwrap();
    let last = bytes.len() - 8;
    bytes[last] ^= 0xff;
    std::fs::write(&artifact, bytes).unwrap();
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    let cubins = gate(&json, "cubins");
    assert_eq!(cubins["status"], "fail", "{json:#}");
    assert!(
        cubins["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("`{kernel}`")),
        "{json:#}"
    );
}

#[test]
fn release_check_refuses_a_version_below_the_last_tag() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=release",
                "-c",
                "user.email=release@example.com",
            ])
            .args(args)
            .current_dir(&library)
            .output()
            .unwrap();
        assert!(output.status.success(), "git {args:?}: {}", stderr(&output));
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "library"]);
    git(&["tag", "v0.2.0"]);
    let (passed, json) = release_check(dir.path(), &library, &[]);
    assert!(!passed);
    let version = gate(&json, "version");
    assert_eq!(version["status"], "fail", "{json:#}");
    let reason = version["reason"].as_str().unwrap();
    assert!(
        reason.contains("0.1.0 is not above the last release 0.2.0 (tag v0.2.0)"),
        "{reason}"
    );

    // Stating another version in the Python package is caught too.
    let init = library.join("python/af3_kernels/__init__.py");
    let text = std::fs::read_to_string(&init)
        .unwrap()
        .replace("\"0.1.0\"", "\"0.3.0\"");
    std::fs::write(&init, text).unwrap();
    let manifest = library.join("kernels.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("version = \"0.1.0\"", "version = \"0.3.0-rc\"");
    std::fs::write(&manifest, text).unwrap();
    let (_, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    let reason = gate(&json, "version")["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("says 0.3.0"), "{reason}");
}
