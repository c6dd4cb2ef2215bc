//! The `kwheel` binary end to end: the README's commands, every verb, and the errors a user
//! meets, on the embedded library with the real toolchains.

mod farm;
mod getting_started;
mod index;
// The build backend's JSON answers (`kwheel pep517 …`).
mod pep517;
mod support;
mod user_text;
mod warm_packs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::*;

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
        // sm_90a, sm_100a, sm_100f, compute_90 × cu129, cu130.
        assert_eq!(record.variants.len() + record.skipped.len(), 8, "{name}");
        for variant in &record.variants {
            bundle.read_artifact(name, variant).unwrap();
        }
    }
}

#[test]
fn readme_test_command_runs_in_its_quick_mode() {
    // Under `ci/test` itself (quick or not) this would run `ci/test` from inside `ci/test`.
    if std::env::var_os("KWHEEL_CI_QUICK").is_some() || !have_toolchains() {
        return;
    }
    let command = &readme_commands()[1];
    assert!(command.contains("ci/test"), "{command}");
    let output = Command::new("bash")
        .arg("-c")
        .arg(command)
        .env("KWHEEL_CI_QUICK", "1")
        .env("KWHEEL_BIN", env!("CARGO_BIN_EXE_kwheel"))
        .current_dir(workspace())
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&output), stderr(&output));
    assert!(output.status.success(), "{command}\n{text}");
    assert!(text.contains("ci/setup: toolchains ready"), "{text}");
    // `kwheel toolchains` found both builds that ci/setup installed.
    for build in ["cu129  ", "cu130  "] {
        assert!(text.lines().any(|line| line.starts_with(build)), "{text}");
    }
    assert!(text.contains("ci/test: quick subset passed"), "{text}");
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

#[test]
fn help_lists_the_exit_codes_the_readme_lists() {
    let output = kwheel().arg("--help").output().unwrap();
    let help = stdout(&output);
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    for code in [USAGE, NOT_FOUND, VERIFICATION, BUILD, NETWORK] {
        assert!(help.contains(&format!("\n  {code}  ")), "{code}: {help}");
        assert!(
            readme.contains(&format!("\n| {code} | ")),
            "{code} in README"
        );
    }
}

fn build_into(dir: &Path, extra: &[&str]) -> Output {
    bundle_kernels(&dir.join("bundle"), &dir.join("cache"))
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
    failure(&output, NOT_FOUND);
    snapshot_settings(dir.path())
        .bind(|| insta::assert_snapshot!("missing_toolchain", rendered(&output)));
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
    assert!(stdout(&output).contains(" built, "), "{}", stdout(&output));

    let output = bundle_list(&dir.path().join("bundle"));
    let text = stdout(&output);
    assert!(text.starts_with("kernel"), "{text}");
    // The table, up to the modules' device code below it.
    let rows: Vec<String> = text
        .lines()
        .take_while(|line| !line.is_empty())
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    // 6 kernels × 4 targets × 2 builds, wgmma's 2 sm_90a variants, its 6 declared skips, and
    // the extension module for cu130 on both CPUs.
    assert_eq!(rows.len(), 1 + 50 + 6 + 2, "{text}");
    for cpu in ["x86_64", "aarch64"] {
        assert!(
            rows.iter()
                .any(|r| r.starts_with(&format!("_C (module) cu130 {cpu} nvcc 13.0."))),
            "{text}"
        );
    }
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
    let output = bundle_extract(&dir.path().join("bundle"), &extracted);
    assert!(output.status.success(), "{}", stderr(&output));
    let cubin = std::fs::read(extracted.join("swiglu/cu130/sm_100a.cubin")).unwrap();
    let info = prebuilt::cubin::inspect_cubin(&cubin).unwrap();
    assert_eq!(info.sm, 100);
    assert!(!extracted
        .join("wgmma_matmul_bf16/cu130/sm_100a.cubin")
        .exists());
    let ptx = std::fs::read(extracted.join("swiglu/cu130/compute_90.ptx")).unwrap();
    let info = prebuilt::cubin::inspect_cubin(&ptx).unwrap();
    assert_eq!((info.sm, info.kind), (90, Some(prebuilt::ArchKind::Ptx)));

    // What would load on a B200 with CUDA 13.0, as a table and as JSON.
    let output = coverage(
        &dir.path().join("bundle"),
        &["--device", "sm_100", "--cuda", "13.0", "--driver", "580.65"],
    );
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
    // The whole table, with its `not built: declared` notes, is user_text's
    // `dev_coverage_b200` snapshot.
    // A fleet in one table: B300 takes the family cubin, Thor and a future GPU the PTX.
    let output = coverage(
        &dir.path().join("bundle"),
        &[
            "--fleet",
            "H200,B200,B300,Thor,GB10,next=13.0",
            "--cuda",
            "13.0",
        ],
    );
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    let row = |kernel: &str| {
        text.lines()
            .find(|line| line.starts_with(kernel))
            .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    // The whole table, its header of devices included, is user_text's `dev_coverage_fleet`.
    assert_eq!(
        row("swiglu").as_deref(),
        Some("swiglu sm_90a sm_100a sm_100f compute_90 compute_90 compute_90"),
        "{text}"
    );
    assert_eq!(
        row("wgmma_matmul_bf16").as_deref(),
        Some("wgmma_matmul_bf16 sm_90a none none none none none"),
        "{text}"
    );
    let output = coverage(
        &dir.path().join("bundle"),
        &[
            "--fleet",
            "Thor",
            "--cuda",
            "13.0",
            "--no-ptx-jit",
            "--json",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let thor = &json["devices"][0]["report"]["kernels"]["swiglu"];
    assert!(thor["loads"].is_null(), "{json}");
    // Each refusal says why, `AF3_KERNELS_PTX_JIT=0` for the PTX.
    compiler_settings(dir.path()).bind(|| {
        insta::assert_snapshot!("dev_coverage_thor_without_ptx_jit_json", rendered(&output))
    });

    let output = coverage(
        &dir.path().join("bundle"),
        &["--device", "8.6", "--cuda", "cu129", "--json"],
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let kernels = json["kernels"].as_object().unwrap();
    assert_eq!(kernels.len(), 7);
    assert!(kernels.values().all(|k| k["loads"].is_null()), "{json}");

    let output = kwheel()
        .args(["dev", "explain", "swiglu", "--against"])
        .arg(dir.path().join("bundle"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    compiler_settings(dir.path())
        .bind(|| insta::assert_snapshot!("dev_explain_against_its_bundle", rendered(&output)));
}

#[test]
fn coverage_says_what_would_jit_and_refuses_a_cuda_build_the_bundle_lacks() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("target/kwheel/_prebuilt");
    let output = bundle_kernels(&bundle, &dir.path().join("cache"))
        .args(["--only", "swiglu"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));

    // Ampere: nothing loads; it says what load() does instead, and fails.
    let output = coverage(&bundle, &["--device", "8.6", "--cuda", "12.9"]);
    assert!(!output.status.success());
    assert_eq!(
        stderr(&output),
        "1 of 1 kernels load no prebuilt cubin on this device: load() would JIT-compile them \
         from the shipped sources on first use (unless AF3_KERNELS_JIT_FALLBACK=0)\n\
         error: no kernel of the bundle has a prebuilt cubin for this device\n"
    );
    // Hopper on 12.9 loads: success, no note.
    let output = coverage(&bundle, &["--device", "sm_90", "--cuda", "12.9"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stderr(&output), "");

    // A CUDA build the bundle was not built for is refused, not tabulated.
    let output = coverage(&bundle, &["--device", "sm_90", "--cuda", "12.8"]);
    failure(&output, USAGE);
    assert!(
        stderr(&output).starts_with(
            "error: the bundle was built for CUDA builds cu129, cu130 only; the runtime's CUDA \
             build cu128 is none of them"
        ),
        "{}",
        stderr(&output)
    );
    assert_eq!(stdout(&output), "");

    // A bundle's parent directory is read as its `_prebuilt/`, the rule `fetch`, `jit` and
    // Python's `kwheel.find_bundle` follow.
    let output = bundle_list(&dir.path().join("target/kwheel"));
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output), stdout(&bundle_list(&bundle)));
    let output = bundle_list(dir.path());
    failure(&output, NOT_FOUND);
    snapshot_settings(dir.path()).bind(|| {
        insta::assert_snapshot!(
            "bundle_list_of_a_folder_two_above_a_bundle",
            rendered(&output)
        )
    });
}

#[test]
fn a_cuda_build_ci_setup_does_not_install_says_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let manifest = library.join("kernels.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    // The extension module narrows the library's builds to cu130: it follows the library's.
    let text = text
        .replace(
            "cuda-builds = [\"cu129\", \"cu130\"]",
            "cuda-builds = [\"cu131\"]",
        )
        .replace("cuda-builds = [\"cu130\"]\n", "");
    assert!(text.contains("\"cu131\"") && !text.contains("\"cu130\""));
    std::fs::write(&manifest, text).unwrap();
    let output = kwheel()
        .args(["toolchains", "--manifest"])
        .arg(&manifest)
        .env_remove("KWHEEL_CUDA_CU131")
        .output()
        .unwrap();
    failed(&output);
    let mut settings = snapshot_settings(dir.path());
    settings.add_filter(
        &testkit::literal_pattern(
            &prebuilt::compile::toolchain_dir("cu131".parse().unwrap())
                .display()
                .to_string(),
        ),
        "[TOOLCHAINS]/cu131",
    );
    settings.bind(|| {
        insta::assert_snapshot!("toolchains_of_a_build_ci_setup_skips", rendered(&output))
    });
}

#[test]
fn a_library_builds_from_its_sdist_recipe_and_the_sdist_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let output = kwheel()
        .args(["dev", "build-sdist", "--manifest"])
        .arg(library.join("kernels.toml"))
        .arg("--out")
        .arg(dir.path().join("sdist"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let sdist = dir.path().join("sdist/af3_kernels-0.1.0.tar.gz");
    assert!(stdout(&output).starts_with(&format!("{} (", sdist.display())));
    let output = kwheel()
        .args(["wheel", "verify"])
        .arg(&sdist)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).ends_with("ok\n"), "{}", stdout(&output));

    // The wheel the build backend builds from it: no toolchain, no cubin.
    let output = kwheel()
        .args([
            "dev",
            "build-wheel",
            "--recipes-only",
            "--quiet",
            "--manifest",
        ])
        .arg(library.join("kernels.toml"))
        .arg("--out")
        .arg(dir.path().join("wheels"))
        .env("KWHEEL_TOOLCHAINS", dir.path().join("no-toolchains"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let wheel = dir
        .path()
        .join("wheels/af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl");
    let output = kwheel()
        .args(["wheel", "verify"])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let mut settings = snapshot_settings(dir.path());
    settings.add_filter(r"\d+ files, \d+ bytes", "[FILES] files, [BYTES] bytes");
    settings.add_filter(r"\d+ files\b", "[FILES] files");
    settings.bind(|| {
        insta::assert_snapshot!("wheel_verify_of_a_recipes_only_wheel", rendered(&output))
    });
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
    // The header, and not `swiglu/swiglu.cu`, is named as changed.
    compiler_settings(dir.path()).bind(|| {
        insta::assert_snapshot!("dev_explain_against_an_edited_header", rendered(&output))
    });
}

#[test]
fn killed_build_leaves_nothing_half_written_and_the_next_run_continues() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mut child = bundle_kernels(&dir.path().join("bundle"), &cache)
        .args(["--jobs", "1"])
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

/// Runs `release check` on the library copy at `library`, with its bundle and wheels in `dir`,
/// the `gpu` gate off (these machines have no GPU; without it the check is incomplete).
fn release_check(dir: &Path, library: &Path, extra: &[&str]) -> (bool, serde_json::Value) {
    let output = kwheel()
        .args(["release", "check", "--json", "--skip", "gpu", "--manifest"])
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

/// A copy of the library under `dir` that passes a first `release check` (which builds its
/// bundle and wheels there), with that check's answer.
fn released_library(dir: &Path) -> (PathBuf, serde_json::Value) {
    let library = copy_library(dir);
    let (passed, json) = release_check(dir, &library, &[]);
    assert!(passed, "{json:#}");
    (library, json)
}

/// The gate `name` of a `release check --json` answer as a snapshot `snapshot`: its status,
/// reason and fix, with the check's folder `root` as `[ROOT]`.
fn assert_gate_snapshot(root: &Path, snapshot: &str, json: &serde_json::Value, name: &str) {
    let text = serde_json::to_string_pretty(gate(json, name)).unwrap();
    compiler_settings(root).bind(|| insta::assert_snapshot!(snapshot, text));
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
    let (library, json) = released_library(dir.path());
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
    assert_eq!(gate(&json, "gpu")["reason"], "off (--skip gpu)", "{json:#}");
    let built = json["built"].as_array().unwrap();
    assert_eq!(
        built.len(),
        3,
        "the bundle, the library wheel and the runtime wheel were missing: {json:#}"
    );
    // 26 of 28 selections install, the 2 others refused only by a declared skip.
    assert_gate_snapshot(dir.path(), "release_check_install_gate", &json, "install");

    // The second run verifies what is there, builds nothing and compiles nothing again.
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(passed, "{json:#}");
    assert!(json["built"].as_array().unwrap().is_empty(), "{json:#}");
    assert_eq!(gate(&json, "rebuild")["status"], "skip", "{json:#}");
    assert_gate_snapshot(
        dir.path(),
        "release_check_rebuild_gate_with_no_rebuild",
        &json,
        "rebuild",
    );
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
            // 26 cubins (some identical ones stored once) and 2 wheels, all verified.
            assert!(publish.contains("verified by download"), "{publish}");
        }
        Err(_) if std::env::var("KWHEEL_REQUIRE_STORE").as_deref() == Ok("1") => {
            panic!("KWHEEL_REQUIRE_STORE=1 but KWHEEL_TEST_STORE is not set")
        }
        Err(_) => skipped("the publish gate: no KWHEEL_TEST_STORE"),
    }

    // The text checklist: one line per gate with its mark. Without a GPU and without
    // `--skip gpu`, the `gpu` gate cannot run: the check is incomplete (exit code 7), never
    // passed.
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
    assert!(text.contains("✔ keys"), "{text}");
    if prebuilt::driver::Driver::get().is_err() {
        assert_eq!(output.status.code(), Some(7), "{text}{}", stderr(&output));
        // The whole checklist as a user reads it, machine details filtered: `? gpu`, and the
        // check incomplete because gpu could not run.
        let mut settings = insta::Settings::clone_current();
        for (pattern, replacement) in testkit::snapshot_filters() {
            settings.add_filter(&pattern, replacement);
        }
        settings.add_filter(r"\d+(\.\d+)? (KiB|MiB|GiB|kB|MB|GB|B)\b", "[SIZE]");
        settings.add_filter(r"\b\d+ (files|bytes)\b", "[N] $1");
        settings.add_filter(r"(nvrtc|nvcc|ptxas) \d+\.\d+\.\d+", "$1 [VERSION]");
        settings.add_filter(r"host [^,)]+", "host [HOST COMPILER]");
        settings.set_prepend_module_to_snapshot(false);
        settings.bind(|| insta::assert_snapshot!("release_check_without_a_gpu", text));
    } else {
        assert!(text.contains("release check passed"), "{text}");
    }
}

#[test]
fn release_check_names_the_kernel_and_file_edited_after_bundling() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (library, _) = released_library(dir.path());
    let source = library.join("sigmoid_gate/sigmoid_gate.cu");
    let text = std::fs::read_to_string(&source).unwrap() + "\n// edited after bundling\n";
    std::fs::write(&source, text).unwrap();
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    assert_eq!(gate(&json, "keys")["status"], "fail");
    // Only the edited kernel and its file are named, and the fix is a `bundle-kernels`.
    assert_gate_snapshot(
        dir.path(),
        "release_check_keys_gate_of_a_source_edited_after_bundling",
        &json,
        "keys",
    );
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
    assert_gate_snapshot(
        dir.path(),
        "release_check_bundle_gate_without_a_bundle",
        &json,
        "bundle",
    );

    let (passed, json) = release_check(dir.path(), &library, &[]);
    assert!(passed, "{json:#}");

    // A target that failed to compile is no skip: the `bundle` gate fails naming it, unless
    // the manifest's `[release] allow-failed` names it. (Another bundle, from the same cache:
    // only the broken kernel compiles.)
    {
        let broken = dir.path().join("broken");
        std::fs::create_dir(&broken).unwrap();
        let library = copy_library(&broken);
        let source = library.join("sigmoid_gate/sigmoid_gate.cu");
        let text = std::fs::read_to_string(&source).unwrap() + "\nnot C++ at all;\n";
        std::fs::write(&source, text).unwrap();
        std::fs::create_dir(broken.join("wheels")).unwrap();
        let cache = dir.path().join("cache");
        let check = |extra: &[&str]| {
            let output = kwheel()
                .args(["release", "check", "--json", "--skip", "gpu", "--manifest"])
                .arg(library.join("kernels.toml"))
                .arg("--bundle")
                .arg(broken.join("bundle"))
                .arg("--wheels")
                .arg(broken.join("wheels"))
                .arg("--cache-dir")
                .arg(&cache)
                .args(extra)
                .output()
                .unwrap();
            let json: serde_json::Value = serde_json::from_slice(&output.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&output), stderr(&output)));
            (output.status.code(), json)
        };
        let (code, json) = check(&["--rebuild-sample", "0"]);
        assert_eq!(code, Some(4), "{json:#}");
        assert_eq!(gate(&json, "bundle")["status"], "fail", "{json:#}");
        assert_gate_snapshot(
            dir.path(),
            "release_check_bundle_gate_with_a_failed_target",
            &json,
            "bundle",
        );
        let manifest = library.join("kernels.toml");
        let text = std::fs::read_to_string(&manifest).unwrap()
            + "\n[release]\nallow-failed = [\"sigmoid_gate\"]\n";
        std::fs::write(&manifest, text).unwrap();
        let (_, json) = check(&["--no-rebuild"]);
        assert_eq!(gate(&json, "bundle")["status"], "pass", "{json:#}");
        assert_gate_snapshot(
            dir.path(),
            "release_check_bundle_gate_with_an_allowed_failed_target",
            &json,
            "bundle",
        );
    }

    // A wheel edited after building: same name, other bytes.
    let wheel = std::fs::read_dir(dir.path().join("wheels"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().contains("af3_kernels-"))
        .unwrap();
    let original = std::fs::read(&wheel).unwrap();
    // One byte inside a stored artifact (its bytes appear verbatim in the zip).
    let artifact = prebuilt::Bundle::open(dir.path().join("bundle"))
        .unwrap()
        .index()
        .kernels
        .values()
        .flat_map(|record| &record.variants)
        .map(|variant| std::fs::read(dir.path().join("bundle").join(&variant.artifact.path)))
        .next()
        .unwrap()
        .unwrap();
    let at = original
        .windows(artifact.len())
        .position(|window| window == artifact.as_slice())
        .expect("stored artifacts appear verbatim in the wheel");
    let mut edited = original.clone();
    edited[at + artifact.len() / 2] ^= 0x5a;
    std::fs::write(&wheel, &edited).unwrap();
    let (passed, json) = release_check(dir.path(), &library, &["--no-rebuild"]);
    assert!(!passed);
    assert_eq!(gate(&json, "reproducible")["status"], "fail", "{json:#}");
    assert_gate_snapshot(
        dir.path(),
        "release_check_reproducible_gate_of_an_edited_wheel",
        &json,
        "reproducible",
    );
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
    assert_eq!(gate(&json, "cubins")["status"], "fail", "{json:#}");
    assert_eq!(
        kernel, "layernorm_bf16",
        "the snapshot names the index's first kernel"
    );
    assert_gate_snapshot(
        dir.path(),
        "release_check_cubins_gate_of_a_corrupted_artifact",
        &json,
        "cubins",
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
    assert_eq!(gate(&json, "version")["status"], "fail", "{json:#}");
    assert_gate_snapshot(
        dir.path(),
        "release_check_version_gate_below_the_last_tag",
        &json,
        "version",
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
    assert_gate_snapshot(
        dir.path(),
        "release_check_version_gate_of_two_versions_stated",
        &json,
        "version",
    );
}

// ---------------------------------------------------------------------------------------------
// Exit codes: each kind of failure, from a real failing input.

/// [`snapshot_settings`] for text that names the compilers: their versions past major.minor
/// and the host compiler nvcc drives are the machine's; a compiler's own line numbers in a
/// source the test edited are filtered too.
fn compiler_settings(root: &Path) -> insta::Settings {
    let mut settings = snapshot_settings(root);
    settings.add_filter(r"(nvrtc|nvcc|ptxas) (\d+\.\d+)\.\d+", "$1 $2.[PATCH]");
    settings.add_filter(r"host [^ ,)]+ \([^)]*\) [0-9.]+", "host [HOST COMPILER]");
    settings.add_filter(r"host [^ ,)]+ [0-9.]+", "host [HOST COMPILER]");
    settings.add_filter(r"\.cu\(\d+\): ", ".cu([LINE]): ");
    settings
}

#[test]
fn an_unknown_command_exits_with_usage() {
    // What it says is user_text's `error_unknown_command` snapshot.
    let output = kwheel().arg("bundel").output().unwrap();
    failure(&output, USAGE);
}

#[test]
fn a_missing_bundle_manifest_or_kernel_exits_with_not_found() {
    // What each says is user_text's `error_not_a_bundle`, `error_missing_manifest` and
    // `error_no_such_kernel` snapshots.
    let output = bundle_list(Path::new("/nonexistent"));
    failure(&output, NOT_FOUND);

    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("kernels.toml");
    let output = kwheel()
        .arg("toolchains")
        .arg("--manifest")
        .arg(&manifest)
        .output()
        .unwrap();
    failure(&output, NOT_FOUND);

    let output = kwheel()
        .args(["dev", "explain", "no_such_kernel"])
        .output()
        .unwrap();
    failure(&output, NOT_FOUND);
}

#[test]
fn a_wheel_that_is_not_a_zip_exits_with_verification() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("broken-1.0-py3-none-any.whl");
    std::fs::write(&wheel, "not a zip archive").unwrap();
    let output = kwheel()
        .args(["wheel", "verify"])
        .arg(&wheel)
        .output()
        .unwrap();
    // What it says is user_text's `error_not_a_zip` snapshot.
    failure(&output, VERIFICATION);
}

#[test]
fn a_cubin_swapped_for_another_in_a_copied_bundle_exits_with_verification() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = build_into(dir.path(), &["--only", "swiglu"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let bundle = dir.path().join("tampered");
    copy_tree(&dir.path().join("bundle"), &bundle, &[]);
    // The sm_100a cubin's file now holds the sm_90a cubin: a valid artifact, the wrong bytes.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("index.json")).unwrap()).unwrap();
    let variants = index["kernels"]["swiglu"]["variants"].as_array().unwrap();
    let path_of = |arch: &str| {
        let variant = variants
            .iter()
            .find(|variant| variant["cuda"] == "cu130" && variant["arch"] == arch)
            .unwrap();
        bundle.join(variant["artifact"]["path"].as_str().unwrap())
    };
    std::fs::copy(path_of("sm_90a"), path_of("sm_100a")).unwrap();

    let output = bundle_extract(&bundle, &dir.path().join("cubins"));
    let text = failure(&output, VERIFICATION);
    snapshot_settings(dir.path())
        .bind(|| insta::assert_snapshot!("bundle_extract_of_a_swapped_cubin", rendered(&output)));
    assert!(!dir.path().join("cubins").exists(), "{text}");
    // The bundle it was copied from is untouched.
    let output = bundle_extract(&dir.path().join("bundle"), &dir.path().join("cubins"));
    assert!(output.status.success(), "{}", stderr(&output));
}

/// A copy of the library under `dir` whose `swiglu` has a line that is not C++.
fn library_with_broken_swiglu(dir: &Path) -> PathBuf {
    let library = copy_library(dir);
    let source = library.join("swiglu/swiglu.cu");
    let mut text = std::fs::read_to_string(&source).unwrap();
    text.push_str("\nthis is not C++;\n");
    std::fs::write(&source, text).unwrap();
    library
}

#[test]
fn a_kernel_that_does_not_compile_exits_with_build() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = library_with_broken_swiglu(dir.path());
    let output = build_into(
        dir.path(),
        &[
            "--manifest",
            library.join("kernels.toml").to_str().unwrap(),
            "--only",
            "swiglu",
            "--require",
        ],
    );
    failure(&output, BUILD);
    compiler_settings(dir.path()).bind(|| {
        insta::assert_snapshot!(
            "bundle_kernels_require_of_a_broken_kernel",
            rendered(&output)
        )
    });
}

#[test]
fn a_store_that_refuses_connections_exits_with_network() {
    // A port that was just free: nothing listens there once the listener is dropped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("any-1.0-py3-none-any.whl");
    std::fs::write(&wheel, "wheel bytes").unwrap();
    let output = kwheel()
        .args(["release", "publish", "--to"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .arg(&wheel)
        .output()
        .unwrap();
    failure(&output, NETWORK);
    let mut settings = snapshot_settings(dir.path());
    settings.add_filter(&format!(r"127\.0\.0\.1:{port}\b"), "127.0.0.1:[PORT]");
    settings.bind(|| {
        insta::assert_snapshot!(
            "release_publish_to_a_store_that_refuses_connections",
            rendered(&output)
        )
    });
}

// ---------------------------------------------------------------------------------------------
// Defaults that come from the current directory only, and the values every command checks.

/// `kwheel <args>` run in `dir`.
fn kwheel_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kwheel"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn a_folder_without_a_manifest_is_an_error_naming_where_it_looked_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().canonicalize().unwrap();
    for args in [
        &["dev", "bundle-kernels", "--quiet"][..],
        &["dev", "build-wheel", "--quiet"],
        &["dev", "build-sdist"],
        &["dev", "explain", "swiglu"],
        &["release", "check", "--no-rebuild"],
        &["toolchains"],
    ] {
        let output = kwheel_in(&here, args);
        let text = failure(&output, NOT_FOUND);
        assert_eq!(
            stderr(&output),
            format!(
                "error: no kernel manifest in {}: looked for `kernels.toml` and \
                 `kernels/kernels.toml`; run the command in the library's folder or give the \
                 manifest with `--manifest path/to/kernels.toml`\n",
                here.display()
            ),
            "{args:?}: {text}"
        );
        // Nothing was written: no bundle of some other library, no target directory.
        let left: Vec<_> = std::fs::read_dir(&here).unwrap().collect();
        assert!(left.is_empty(), "{args:?} wrote {left:?}");
    }
}

#[test]
fn the_default_manifest_is_kernels_toml_here_then_kernels_kernels_toml() {
    let dir = tempfile::tempdir().unwrap();
    // A library's own folder: kernels.toml beside pyproject.toml.
    let flat = dir.path().join("flat");
    copy_tree(&workspace().join("kernels"), &flat, &["reference"]);
    let output = kwheel_in(&flat, &["dev", "explain", "swiglu"]);
    assert!(output.status.success(), "{}", text(&output));
    // A project with its kernels in kernels/, as a clone of kwheel is.
    let nested = dir.path().join("nested");
    copy_library(&nested);
    let output = kwheel_in(&nested, &["dev", "explain", "swiglu"]);
    assert!(output.status.success(), "{}", text(&output));
    // One level down in either is no library folder: nothing above the current directory is
    // a default.
    let output = kwheel_in(
        &nested.join("kernels/swiglu"),
        &["dev", "explain", "swiglu"],
    );
    failure(&output, NOT_FOUND);
}

#[test]
fn an_invalid_manifest_exits_with_usage_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("kernels.toml");
    std::fs::write(
        &manifest,
        "[library]\npackage = \"x\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\n\
         torch = \"2.13.*\"\nflavour = 1\n",
    )
    .unwrap();
    let output = kwheel_in(dir.path(), &["toolchains"]);
    failure(&output, USAGE);
    snapshot_settings(dir.path()).bind(|| {
        insta::assert_snapshot!(
            "toolchains_of_a_manifest_with_an_unknown_key",
            rendered(&output)
        )
    });
}

#[test]
fn bad_device_cuda_and_driver_values_exit_with_usage() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().to_str().unwrap();
    let settings = snapshot_settings(dir.path());
    for (name, args) in [
        (
            "dev_coverage_of_an_unknown_device",
            &[
                "dev", "coverage", bundle, "--device", "X100", "--cuda", "13.0",
            ][..],
        ),
        (
            "dev_coverage_of_a_cuda_version_without_its_minor",
            &[
                "dev", "coverage", bundle, "--device", "sm_90", "--cuda", "13",
            ],
        ),
        (
            "dev_coverage_of_a_driver_that_is_no_version",
            &[
                "dev", "coverage", bundle, "--device", "sm_90", "--cuda", "13.0", "--driver", "abc",
            ],
        ),
        (
            "fetch_of_an_unknown_device",
            &["fetch", bundle, "--device", "H1000", "--cuda", "13.0"],
        ),
        (
            "fetch_of_a_cuda_version_that_is_no_version",
            &["fetch", bundle, "--device", "sm_90", "--cuda", "abc"],
        ),
    ] {
        let output = kwheel_in(dir.path(), args);
        failure(&output, USAGE);
        let text = format!("$ kwheel {}\n{}", args.join(" "), rendered(&output));
        settings.bind(|| insta::assert_snapshot!(name, text));
    }
}

#[test]
fn gpu_names_are_devices_wherever_devices_are_taken() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let output = build_into(dir.path(), &["--only", "swiglu"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let bundle = dir.path().join("bundle");
    let coverage_of = |device: &str| {
        let output = coverage(&bundle, &["--device", device, "--cuda", "13.0", "--json"]);
        assert!(output.status.success(), "{device}: {}", text(&output));
        stdout(&output)
    };
    // As `--fleet H100` and `--fleet B300` read them: 9.0 and 10.3.
    assert_eq!(coverage_of("H100"), coverage_of("sm_90"));
    assert_eq!(coverage_of("h200"), coverage_of("9.0"));
    assert_eq!(coverage_of("B300"), coverage_of("10.3"));
    assert_ne!(coverage_of("H100"), coverage_of("B300"));
}

#[test]
fn build_commands_and_toolchains_answer_in_json_for_the_build_backend() {
    if !have_toolchains() {
        return;
    }
    let output = kwheel().args(["toolchains", "--json"]).output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let answer: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(answer["missing"], serde_json::json!([]));
    let builds: Vec<&str> = answer["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|build| build["build"].as_str().unwrap())
        .collect();
    assert_eq!(builds, ["cu129", "cu130"]);

    let dir = tempfile::tempdir().unwrap();
    let output = kwheel()
        .args(["dev", "build-sdist", "--json", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let answer: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(answer["file_name"], "af3_kernels-0.1.0.tar.gz");
    assert_eq!(answer["verified"], true);
    let path = Path::new(answer["path"].as_str().unwrap());
    assert_eq!(std::fs::metadata(path).unwrap().len(), answer["size"]);
}

#[test]
fn the_stale_bundle_hint_repeats_the_options_given_and_following_it_works() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let manifest = library.join("kernels.toml");
    let bundle = dir.path().join("my bundle");
    let cache = dir.path().join("cache");
    let options = |command: &mut Command| {
        command
            .arg("--manifest")
            .arg(&manifest)
            .arg("--torch")
            .arg("2.11.*")
            .arg("--cache-dir")
            .arg(&cache);
    };
    let mut bundling = kwheel();
    bundling
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(&bundle);
    options(&mut bundling);
    let output = bundling.output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let header = library.join("include/af3/common.cuh");
    let mut text_of = std::fs::read_to_string(&header).unwrap();
    text_of.push_str("\n// edited after bundling\n");
    std::fs::write(&header, text_of).unwrap();

    let wheels = dir.path().join("wheels");
    let build_wheel = || {
        let mut command = kwheel();
        command
            .args(["dev", "build-wheel", "--quiet", "--bundle"])
            .arg(&bundle)
            .arg("--out")
            .arg(&wheels);
        options(&mut command);
        command.output().unwrap()
    };
    let output = build_wheel();
    let text = failure(&output, VERIFICATION);
    let hint = stderr(&output)
        .lines()
        .find_map(|line| line.strip_prefix("hint: rebuild the bundle with `"))
        .map(|rest| rest.split('`').next().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no hint:\n{text}"));
    assert_eq!(
        hint,
        format!(
            "kwheel dev bundle-kernels --manifest {} --out '{}' --torch '2.11.*' --cache-dir {}",
            manifest.display(),
            bundle.display(),
            cache.display()
        )
    );
    snapshot_settings(dir.path()).bind(|| {
        insta::assert_snapshot!(
            "dev_build_wheel_stale_bundle_hint_with_options",
            rendered(&output)
        )
    });
    // The hint as a shell runs it, with this `kwheel`, then the same build-wheel passes.
    let output = Command::new("bash")
        .arg("-c")
        .arg(hint.replacen("kwheel", env!("CARGO_BIN_EXE_kwheel"), 1) + " --quiet")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", support::text(&output));
    let output = build_wheel();
    assert!(output.status.success(), "{}", support::text(&output));
}

#[test]
fn one_syntax_error_is_summarized_once_with_every_target_it_hit() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = library_with_broken_swiglu(dir.path());
    let bundle = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kwheel"))
            .args(["dev", "bundle-kernels", "--quiet", "--only", "swiglu"])
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(extra)
            .current_dir(&library)
            .output()
            .unwrap()
    };
    let output = bundle(&[]);
    failure(&output, BUILD);
    let errors = stderr(&output);
    // Everything printed by default, not only the summary: no per-target log before it.
    assert!(errors.lines().count() <= 15, "{errors}");
    // One group: the error once, every target it hit (each build's four archs) under it, and
    // the log file that holds the rest.
    let settings = compiler_settings(dir.path());
    settings
        .bind(|| insta::assert_snapshot!("one_syntax_error_on_every_target", rendered(&output)));
    // The whole of every log is in the file the summary names, and behind --verbose.
    let log =
        std::fs::read_to_string(library.join("target/kwheel/logs/bundle-kernels.log")).unwrap();
    assert_eq!(log.matches("expected a declaration").count(), 8, "{log}");
    let verbose = stderr(&bundle(&["--verbose"]));
    let verbose = &verbose[verbose.find("error: ").unwrap()..];
    assert_eq!(
        verbose.matches("expected a declaration").count(),
        8,
        "{verbose}"
    );
    // Replayed from the build cache, the failures still name their targets with the compiler
    // that failed them, and are still one group.
    let replayed = bundle(&[]);
    failure(&replayed, BUILD);
    settings.bind(|| {
        insta::assert_snapshot!(
            "one_syntax_error_replayed_from_the_build_cache",
            rendered(&replayed)
        )
    });
}
