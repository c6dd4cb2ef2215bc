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
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    let ci_commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('#') && !l.starts_with("set ") && !l.starts_with("cd ")
        })
        .collect();
    assert_eq!(
        ci_commands.join(" && "),
        commands[1],
        ".ci/run must run the README's test command"
    );
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
