//! Snapshots of what a user reads from the binary: every `--help`, the errors met most often,
//! `bundle list`, `dev coverage` and `dev explain`. Temp paths, digests, keys, the host
//! compiler and cubin sizes are filtered (they change from machine to machine or with every
//! source edit); the layout, the words and the exit codes are what the snapshots hold.
//!
//! After a deliberate change of that text: `INSTA_UPDATE=always cargo test --release --test
//! cli user_text` rewrites the `.snap` files, to be reviewed in the diff.

use super::*;

mod modules;

/// Runs `kwheel args` and renders what a user sees: the command, its exit code, its output.
fn session(args: &[&str]) -> String {
    transcript(kwheel(), args)
}

/// Runs `command` (a `kwheel` with its folder and environment) with `args`, rendered as
/// [`session`] renders it.
fn transcript(mut command: Command, args: &[&str]) -> String {
    let output = command.args(args).output().unwrap();
    let code = output.status.code().unwrap_or(-1);
    let text = text(&output);
    assert!(!text.contains("panicked"), "{text}");
    format!("$ kwheel {}\nexit code: {code}\n{text}", args.join(" "))
}

/// [`session`] of a command whose `--json` answer is one line of JSON: the answer
/// pretty-printed (its keys sorted), so that each field is a line of the snapshot.
fn json_session(args: &[&str]) -> String {
    json_transcript(kwheel(), args)
}

/// [`json_session`] of `command` (a `kwheel` with its folder and environment) with `args`.
fn json_transcript(mut command: Command, args: &[&str]) -> String {
    let output = command.args(args).output().unwrap();
    let code = output.status.code().unwrap_or(-1);
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));
    let stderr = stderr(&output);
    assert!(!stderr.contains("panicked"), "{stderr}");
    format!(
        "$ kwheel {}\nexit code: {code}\n{}\n{stderr}",
        args.join(" "),
        serde_json::to_string_pretty(&answer).unwrap()
    )
}

/// A temporary folder for a test that needs the toolchains; `None` (said) without them.
fn folder_with_toolchains() -> Option<tempfile::TempDir> {
    have_toolchains().then(|| tempfile::tempdir().unwrap())
}

/// The kit's filters, plus the table columns of this binary that change with every build.
fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in testkit::snapshot_filters() {
        settings.add_filter(&pattern, replacement);
    }
    // The host compiler that nvcc drives is the machine's own.
    settings.add_filter(r"host [^ ]+ \([^)]*\) [0-9.]+", "host [HOST COMPILER]");
    settings.add_filter(r"host [^ ]+ [0-9.]+", "host [HOST COMPILER]");
    // `bundle list`: size, stored size and short key of a row.
    settings.add_filter(r"\d+( +)\d+( +)\[HEX\]", "[SIZE]$1[STORED]$2[KEY]");
    settings.set_prepend_module_to_snapshot(false);
    settings
}

/// The subcommands a `--help` text lists under `Commands:`, `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_help_text() {
    let settings = settings();
    let mut pending = vec![Vec::<String>::new()];
    let mut seen = 0;
    while let Some(path) = pending.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let output = kwheel().args(&args).output().unwrap();
        assert!(output.status.success(), "{}", text(&output));
        let help = stdout(&output);
        let name = if path.is_empty() {
            "help".to_owned()
        } else {
            format!("help_{}", path.join("_"))
        };
        settings.bind(|| insta::assert_snapshot!(name, help));
        seen += 1;
        for command in subcommands(&help) {
            let mut next = path.clone();
            next.push(command);
            pending.push(next);
        }
    }
    // The top level, its eight commands, and theirs.
    assert!(seen > 20, "{seen} help texts");
}

#[test]
fn errors_a_user_meets() {
    let dir = tempfile::tempdir().unwrap();
    let missing_manifest = dir.path().join("kernels.toml").display().to_string();
    let invalid = dir.path().join("invalid");
    std::fs::create_dir_all(&invalid).unwrap();
    let invalid_manifest = invalid.join("kernels.toml");
    std::fs::write(
        &invalid_manifest,
        "[library]\npackage = \"demo\"\narchs = [\"sm_90a\"]\ncuda-builds = [\"cu130\"]\n\
         torch = \"2.13.*\"\n\n[kernels.one]\nsources = 3\n",
    )
    .unwrap();
    let invalid_manifest = invalid_manifest.display().to_string();
    let not_a_wheel = dir.path().join("demo-1.0-py3-none-any.whl");
    std::fs::write(&not_a_wheel, b"not a zip").unwrap();
    let not_a_wheel = not_a_wheel.display().to_string();
    let cases: [(&str, Vec<&str>); 6] = [
        ("error_unknown_command", vec!["bundel"]),
        ("error_not_a_bundle", vec!["bundle", "list", "/nonexistent"]),
        (
            "error_missing_manifest",
            vec!["toolchains", "--manifest", &missing_manifest],
        ),
        (
            "error_invalid_manifest",
            vec!["toolchains", "--manifest", &invalid_manifest],
        ),
        (
            "error_no_such_kernel",
            vec!["dev", "explain", "no_such_kernel"],
        ),
        ("error_not_a_zip", vec!["wheel", "verify", &not_a_wheel]),
    ];
    let settings = settings();
    for (name, args) in cases {
        let text = session(&args);
        settings.bind(|| insta::assert_snapshot!(name, text));
    }
}

#[test]
fn dev_explain_of_a_kernel() {
    if !have_toolchains() {
        return;
    }
    let text = session(&["dev", "explain", "swiglu"]);
    settings().bind(|| insta::assert_snapshot!("dev_explain_swiglu", text));
}

/// The default library bundled into `dir/bundle`, from the user's build cache (warm after
/// `ci/test`'s own bundle of it).
fn default_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    let output = kwheel()
        .args(["dev", "bundle-kernels", "--quiet", "--out"])
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    bundle
}

#[test]
fn bundle_list_and_dev_coverage_of_the_default_library() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let bundle = default_bundle(dir.path()).display().to_string();
    let settings = settings();
    let list = session(&["bundle", "list", &bundle]);
    // The compiler column is as wide as the host compiler's name: columns kept, widths not.
    let mut columns = settings.clone();
    columns.add_filter(r" {2,}", "  ");
    columns.bind(|| insta::assert_snapshot!("bundle_list", list));
    // `--json`, whole: the sizes filtered as the table's columns are.
    let list_json = session(&["bundle", "list", "--json", &bundle]);
    let mut sized = settings.clone();
    sized.add_filter(r#""size": \d+"#, r#""size": [SIZE]"#);
    sized.add_filter(r#""stored_size": \d+"#, r#""stored_size": [STORED]"#);
    sized.bind(|| insta::assert_snapshot!("bundle_list_json", list_json));
    // Every kernel with what the manifest declares it requires, as the index has it.
    let json = kwheel()
        .args(["bundle", "list", "--json", &bundle])
        .output()
        .unwrap();
    assert!(json.status.success(), "{}", text(&json));
    let listing: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let manifest = bundler::Manifest::load(&workspace().join("kernels/kernels.toml")).unwrap();
    for (name, kernel) in &manifest.kernels {
        let requirements = bundler::Manifest::requirements_of(kernel);
        assert!(
            !requirements.rules.is_empty(),
            "{name} declares requirements"
        );
        let listed = &listing["kernels"][name];
        assert_eq!(
            listed["inputs"],
            serde_json::json!(requirements.inputs),
            "{name}"
        );
        assert_eq!(
            listed["requires"],
            serde_json::json!(requirements.rules),
            "{name}"
        );
        assert!(!listed["variants"].as_array().unwrap().is_empty(), "{name}");
    }
    // Each coverage query as text and as `--json`.
    let device: &[&str] = &["--device", "sm_100", "--cuda", "13.0", "--driver", "580.65"];
    let fleet: &[&str] = &[
        "--fleet",
        "H200,B200,B300,Thor,GB10,next=13.0",
        "--cuda",
        "13.0",
    ];
    for (name, query) in [("dev_coverage_b200", device), ("dev_coverage_fleet", fleet)] {
        let args: Vec<&str> = ["dev", "coverage", &bundle]
            .into_iter()
            .chain(query.iter().copied())
            .collect();
        let text = session(&args);
        settings.bind(|| insta::assert_snapshot!(name, text));
        let json = session(&[&args[..], &["--json"]].concat());
        settings.bind(|| insta::assert_snapshot!(format!("{name}_json"), json));
    }
}

/// A CI matrix's two shards merged into one bundle, `fetch` of a bundle that holds all it
/// lists (no store to fetch from), `bundle extract` of it, `release publish` of it to a store
/// (twice), and the default library's sdist: what each prints. `fetch` and `release publish`
/// also as `--json`, whole.
#[test]
fn shards_merged_fetched_extracted_published_and_an_sdist() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let root = dir.path().display().to_string();
    let mut settings = settings();
    settings.add_filter(&testkit::literal_pattern(&root), "[ROOT]");
    let cache_home = prebuilt::cache::cache_home_or_unwritable();
    settings.add_filter(
        &testkit::literal_pattern(&cache_home.display().to_string()),
        "[CACHE HOME]",
    );
    let shards: Vec<String> = ["1/2", "2/2"]
        .iter()
        .map(|shard| {
            let out = format!("{root}/shard-{}", &shard[..1]);
            let built = session(&[
                "dev",
                "bundle-kernels",
                "--quiet",
                "--only",
                "swiglu,sigmoid_gate",
                "--shard",
                shard,
                "--out",
                &out,
            ]);
            assert!(built.contains("exit code: 0"), "{built}");
            out
        })
        .collect();
    let merged_dir = format!("{root}/merged");
    let merged = session(&[
        "dev",
        "merge-bundles",
        &shards[0],
        &shards[1],
        "--out",
        &merged_dir,
    ]);
    settings.bind(|| insta::assert_snapshot!("dev_merge_bundles", merged));
    let fetched = session(&["fetch", &merged_dir, "--device", "H200", "--cuda", "13.0"]);
    settings.bind(|| insta::assert_snapshot!("fetch_of_a_whole_bundle", fetched));
    let fetched_json = json_session(&[
        "fetch",
        &merged_dir,
        "--device",
        "H200",
        "--cuda",
        "13.0",
        "--json",
    ]);
    settings.bind(|| insta::assert_snapshot!("fetch_of_a_whole_bundle_json", fetched_json));
    let extracted = session(&[
        "bundle",
        "extract",
        &merged_dir,
        "--out",
        &format!("{root}/cubins"),
    ]);
    settings.bind(|| insta::assert_snapshot!("bundle_extract", extracted));
    // Its artifacts published to a store, then again (everything already there).
    let store = testkit::loopback_store::LoopbackStore::start();
    let mut published = settings.clone();
    published.add_filter(&testkit::literal_pattern(&store.url()), "[STORE]");
    published.add_filter(r"\(\d+ bytes\)", "([SIZE] bytes)");
    published.add_filter(r#""bytes": \d+"#, r#""bytes": [SIZE]"#);
    for name in ["release_publish", "release_publish_again"] {
        let text = session(&[
            "release",
            "publish",
            "--to",
            &store.url(),
            "--bundle",
            &merged_dir,
        ]);
        published.bind(|| insta::assert_snapshot!(name, text));
    }
    // `--json` to another store: every object uploaded, then every one already there.
    let json_store = testkit::loopback_store::LoopbackStore::start();
    let mut published_json = settings.clone();
    published_json.add_filter(&testkit::literal_pattern(&json_store.url()), "[STORE]");
    published_json.add_filter(r#""size": \d+"#, r#""size": [SIZE]"#);
    for name in ["release_publish_json", "release_publish_again_json"] {
        let json = json_session(&[
            "release",
            "publish",
            "--to",
            &json_store.url(),
            "--bundle",
            &merged_dir,
            "--json",
        ]);
        published_json.bind(|| insta::assert_snapshot!(name, json));
    }
    // A copy of the bundle that names the store and holds no artifacts: `fetch` downloads what
    // an H200 loads into an empty cache, then finds it there; a store that lost them fails it.
    let slim = format!("{root}/slim");
    copy_tree(Path::new(&merged_dir), Path::new(&slim), &["artifacts"]);
    let index_path = Path::new(&slim).join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["store"] = store.url().into();
    std::fs::write(&index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    let fetch_command = |cache: &str| {
        let mut command = kwheel();
        command.env("KWHEEL_ARTIFACT_CACHE", format!("{root}/{cache}"));
        command
    };
    let fetch_args = ["fetch", &slim, "--device", "H200", "--cuda", "13.0"];
    let fetch = |cache: &str| transcript(fetch_command(cache), &fetch_args);
    let fetch_json = |cache: &str| {
        json_transcript(
            fetch_command(cache),
            &[&fetch_args[..], &["--json"]].concat(),
        )
    };
    for name in [
        "fetch_downloads_from_the_store",
        "fetch_finds_the_download_cached",
    ] {
        let text = fetch("artifact-cache");
        published.bind(|| insta::assert_snapshot!(name, text));
    }
    for name in [
        "fetch_downloads_from_the_store_json",
        "fetch_finds_the_download_cached_json",
    ] {
        let json = fetch_json("artifact-cache-json");
        published.bind(|| insta::assert_snapshot!(name, json));
    }
    store.fail_always(Some(testkit::loopback_store::Fault::Status(404)));
    let text = fetch("another-artifact-cache");
    published.bind(|| insta::assert_snapshot!("fetch_from_a_store_without_the_artifacts", text));
    let json = fetch_json("a-third-artifact-cache");
    published
        .bind(|| insta::assert_snapshot!("fetch_from_a_store_without_the_artifacts_json", json));
    let manifest = workspace()
        .join("kernels/kernels.toml")
        .display()
        .to_string();
    let sdist = session(&[
        "dev",
        "build-sdist",
        "--manifest",
        &manifest,
        "--out",
        &format!("{root}/sdist"),
    ]);
    // The sdist's size and file count change with every edit of the embedded library.
    let mut sized = settings.clone();
    sized.add_filter(r"\(\d+ files, \d+ bytes\)", "([FILES] files, [SIZE] bytes)");
    sized.bind(|| insta::assert_snapshot!("dev_build_sdist", sdist));
    let sdist_json = json_session(&[
        "dev",
        "build-sdist",
        "--manifest",
        &manifest,
        "--out",
        &format!("{root}/sdist-json"),
        "--json",
    ]);
    let mut counted = settings.clone();
    counted.add_filter(r#""(size|files)": \d+"#, r#""$1": [N]"#);
    counted.bind(|| insta::assert_snapshot!("dev_build_sdist_json", sdist_json));
    // `wheel verify` of that sdist: what it holds and the kernels its sources plan.
    let built = file_ending_in(Path::new(&format!("{root}/sdist")), ".tar.gz");
    let verified = session(&["wheel", "verify", &built]);
    sized.add_filter(r"\d+ files, \d+ kernels", "[FILES] files, [N] kernels");
    sized.bind(|| insta::assert_snapshot!("wheel_verify_of_an_sdist", verified));
}

/// The path of the one file in `dir` whose name ends in `suffix` (`.whl`, `.tar.gz`).
fn file_ending_in(dir: &Path, suffix: &str) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path().display().to_string())
        .find(|path| path.ends_with(suffix))
        .unwrap_or_else(|| panic!("no file ending in {suffix} in {}", dir.display()))
}

/// What a newcomer reads in the first steps on the default library: the toolchains found,
/// the wheel built from a bundle and what `wheel verify` says of it. The
/// toolchain folders, versions, sizes and file counts are filtered; the words and the layout
/// are the snapshot.
#[test]
fn toolchains_build_wheel_and_wheel_verify_of_the_default_library() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let bundle = default_bundle(dir.path());
    let mut settings = settings();
    settings.add_filter(r"(nvrtc|nvcc) \d+\.\d+\.\d+", "$1 [VERSION]");
    settings.add_filter(r"\(targets( sm_\d+)+\)", "(targets [SMS])");
    settings.add_filter(r"/\S*/toolchains/(cu\d+)", "[TOOLCHAINS]/$1");
    settings.add_filter(r"\d+ files, \d+ bytes", "[FILES] files, [BYTES] bytes");
    settings.add_filter(r"\d+ files\b", "[FILES] files");
    settings.add_filter(r#""(size|files)": \d+"#, r#""$1": [N]"#);
    let toolchains = session(&["toolchains"]);
    settings.bind(|| insta::assert_snapshot!("toolchains", toolchains));
    // The targets a toolchain lists are its version's, as `(targets [SMS])` is in the text.
    let mut targets = settings.clone();
    targets.add_filter(r#""targets": \[[^\]]*\]"#, r#""targets": [SMS]"#);
    let toolchains_json = json_session(&["toolchains", "--json"]);
    targets.bind(|| insta::assert_snapshot!("toolchains_json", toolchains_json));
    let wheels = dir.path().join("wheels");
    let (bundle, wheels) = (bundle.display().to_string(), wheels.display().to_string());
    let built = session(&["dev", "build-wheel", "--bundle", &bundle, "--out", &wheels]);
    settings.bind(|| insta::assert_snapshot!("dev_build_wheel", built));
    let wheels_json = dir.path().join("wheels-json").display().to_string();
    let built_json = json_session(&[
        "dev",
        "build-wheel",
        "--bundle",
        &bundle,
        "--out",
        &wheels_json,
        "--json",
    ]);
    settings.bind(|| insta::assert_snapshot!("dev_build_wheel_json", built_json));
    let wheel = file_ending_in(Path::new(&wheels), ".whl");
    let verified = session(&["wheel", "verify", &wheel]);
    settings.bind(|| insta::assert_snapshot!("wheel_verify", verified));
}

/// A library that hits every outcome on purpose: a kernel built for both archs, one the
/// manifest narrows to sm_90a (a declared skip), one whose sm_100a body is a stub (a stub
/// skip), and one that does not compile (a failed target). The text and the `--json` report
/// of one build are snapshots; the build cache is its own, so every target compiles.
#[test]
fn bundle_kernels_reports_every_outcome() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let library = dir.path().join("library");
    std::fs::create_dir_all(&library).unwrap();
    let kernel = |name: &str, body: &str| {
        format!("extern \"C\" __global__ void {name}(float* out, int n) {{\n{body}\n}}\n")
    };
    let sources = [
        (
            "scale.cu",
            kernel("scale", "  if (threadIdx.x < n) out[threadIdx.x] *= 2.0f;"),
        ),
        (
            "narrowed.cu",
            kernel(
                "narrowed",
                "  if (threadIdx.x < n) out[threadIdx.x] = 1.0f;",
            ),
        ),
        (
            "hopper_only.cu",
            kernel(
                "hopper_only",
                "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000\n  if (threadIdx.x < n) \
                 out[threadIdx.x] += 1.0f;\n#else\n  asm(\"trap;\");\n#endif",
            ),
        ),
        (
            "broken.cu",
            kernel("broken", "  out[threadIdx.x] = undeclared_name;"),
        ),
    ];
    for (file, text) in &sources {
        std::fs::write(library.join(file), text).unwrap();
    }
    let mut manifest =
        "[library]\npackage = \"every-outcome\"\narchs = [\"sm_90a\", \"sm_100a\"]\n\
                        cuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n"
            .to_owned();
    for (file, _) in &sources {
        let name = file.trim_end_matches(".cu");
        manifest.push_str(&format!(
            "\n[kernels.{name}]\nsources = [\"{file}\"]\nentries = [\"{name}\"]\n"
        ));
        if name == "narrowed" {
            manifest.push_str("arch = [\"sm_90a\"]\n");
        }
    }
    std::fs::write(library.join("kernels.toml"), manifest).unwrap();
    let build = |json: bool| {
        let mut command = kwheel();
        command
            .current_dir(dir.path())
            .args([
                "dev",
                "bundle-kernels",
                "--quiet",
                "--manifest",
                "library/kernels.toml",
            ])
            .args(["--out", "bundle", "--cache-dir", "cache"])
            .env_remove("RUST_LOG");
        if json {
            command.arg("--json");
        }
        let output = command.output().unwrap();
        let code = output.status.code().unwrap_or(-1);
        (code, stdout(&output), stderr(&output))
    };
    let mut settings = settings();
    settings.add_filter(r#""seconds": [0-9.e-]+"#, r#""seconds": [SECONDS]"#);
    settings.add_filter(r"nvcc \d+\.\d+\.\d+", "nvcc [VERSION]");
    settings.add_filter(r#""size": \d+"#, r#""size": [SIZE]"#);
    // nvcc's own words for the error, and the log file's place, are the machine's.
    settings.add_filter(
        r"(?m)^( +)(broken\.cu|\S*/broken\.cu)\(\d+\): .*$",
        "$1[NVCC ERROR]",
    );
    let (code, out, err) = build(false);
    let text = format!("exit code: {code}\n--- stdout\n{out}--- stderr\n{err}");
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_every_outcome", text));
    // The same build again: every target from the cache (the failure replayed), as JSON.
    let (code, out, _) = build(true);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let outcomes: Vec<String> = report["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|target| {
            let detail = target["source"]
                .as_str()
                .or(target["kind"].as_str())
                .or(target["replayed"]
                    .as_bool()
                    .map(|r| if r { "replayed" } else { "run" }))
                .unwrap_or("?");
            format!(
                "{} {} {}: {} ({detail})",
                target["kernel"].as_str().unwrap(),
                target["cuda"].as_str().unwrap(),
                target["arch"].as_str().unwrap(),
                target["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            "broken cu130 sm_90a: failed (replayed)",
            "broken cu130 sm_100a: failed (replayed)",
            "hopper_only cu130 sm_90a: built (cached)",
            "hopper_only cu130 sm_100a: skipped (stub)",
            "narrowed cu130 sm_90a: built (cached)",
            "narrowed cu130 sm_100a: skipped (declared)",
            "scale cu130 sm_90a: built (cached)",
            "scale cu130 sm_100a: built (cached)",
        ]
    );
    let mut json = settings.clone();
    json.add_filter(r#""error": "(?:[^"\\]|\\.)*""#, r#""error": "[ERROR]""#);
    json.add_filter(r#""reason": "(?:[^"\\]|\\.)*""#, r#""reason": "[REASON]""#);
    json.add_filter(r#""out": "[^"]*""#, r#""out": "[OUT]""#);
    json.bind(|| insta::assert_snapshot!("bundle_kernels_every_outcome_json", out));
}

/// `release build-kwheel` as the README's Install runs it: the progress it prints around
/// cargo's own lines (left out: they change with what cargo has to rebuild), the wheel it
/// verified, and the refusal of a prebuilt module for more than one architecture. The build
/// shares the tests' cross-build directory, so after the first build of a run it builds nothing.
#[test]
fn release_build_kwheel() {
    if release::runtime::find_cargo_zigbuild().is_none() || release::runtime::find_zig().is_none() {
        assert!(
            std::env::var("KWHEEL_REQUIRE_TOOLCHAINS").as_deref() != Ok("1"),
            "cargo-zigbuild and zig are required (`bash ci/setup-wheel` installs them)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("wheels").display().to_string();
    let target = release::runtime::default_target_dir(&workspace());
    let mut settings = settings();
    settings.add_filter(
        &testkit::literal_pattern(&target.display().to_string()),
        "[TARGET]",
    );
    settings.add_filter(&testkit::literal_pattern(&out), "[OUT]");
    settings.add_filter(r"\(zig: [^;]+;", "(zig: [ZIG];");
    settings.add_filter(r"\d+ files, \d+ bytes", "[FILES] files, [BYTES] bytes");
    // cargo's own lines: what it compiles depends on what the directory holds already.
    settings.add_filter(
        r"(?m)^ *(Compiling|Finished|Blocking|Fresh|Locking|Updating|Downloading|Downloaded|Checking|Running|warning:).*\n",
        "",
    );
    let built = session(&["release", "build-kwheel", "--arch", "x86_64", "--out", &out]);
    settings.bind(|| insta::assert_snapshot!("release_build_kwheel", built));
    let refused = session(&[
        "release",
        "build-kwheel",
        "--arch",
        "x86_64,aarch64",
        "--module",
        "kwheel.so",
        "--out",
        &out,
    ]);
    settings.bind(|| insta::assert_snapshot!("release_build_kwheel_two_archs_one_module", refused));
}

/// [`session`] run in `dir` (a relative path a command prints, such as its log's, stays in
/// `dir`).
fn session_in(dir: &Path, args: &[&str]) -> String {
    let output = kwheel_in(dir, args);
    let code = output.status.code().unwrap_or(-1);
    let text = text(&output);
    assert!(!text.contains("panicked"), "{text}");
    format!("$ kwheel {}\nexit code: {code}\n{text}", args.join(" "))
}

/// Refusals of input that needs nothing built: warm packs that are no pack or of another
/// format, sdists that are no gzip or lack their files, and a `release check` whose bundle
/// is missing (`--no-rebuild`), as text and as `--json`.
#[test]
fn refusals_of_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut settings = settings();
    settings.add_filter(
        &testkit::literal_pattern(&root.display().to_string()),
        "[ROOT]",
    );
    let write = |relative: &str, bytes: &[u8]| {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
    };
    std::fs::create_dir(root.join("no-pack")).unwrap();
    write("not-a-pack/pack.json", b"{}");
    write(
        "newer-pack/pack.json",
        br#"{"format":99,"package":"af3-kernels","torch":"2.13.*","kernels":{}}"#,
    );
    let cases = [
        ("jit_import_of_a_folder_without_a_pack", "no-pack"),
        ("jit_import_of_a_pack_json_that_is_no_pack", "not-a-pack"),
        ("jit_import_of_a_newer_pack_format", "newer-pack"),
    ];
    for (name, pack) in cases {
        let text = session_in(root, &["jit", "import", pack]);
        settings.bind(|| insta::assert_snapshot!(name, text));
    }

    // An sdist that is no gzip, and one holding only a README.
    write("broken-1.0.tar.gz", b"not gzip");
    write("sdist/demo-1.0/README", b"demo\n");
    let tar = std::process::Command::new("tar")
        .args(["-czf", "demo-1.0.tar.gz", "-C", "sdist", "demo-1.0"])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(tar.status.success(), "{}", text(&tar));
    for (name, sdist) in [
        (
            "wheel_verify_of_an_sdist_that_is_no_gzip",
            "broken-1.0.tar.gz",
        ),
        (
            "wheel_verify_of_an_sdist_without_its_files",
            "demo-1.0.tar.gz",
        ),
    ] {
        let text = session_in(root, &["wheel", "verify", sdist]);
        settings.bind(|| insta::assert_snapshot!(name, text));
    }

    // `release check` of a library without a bundle, told not to build one.
    let library = copy_library(root);
    let manifest = library.join("kernels.toml").display().to_string();
    let check = [
        "release",
        "check",
        "--skip",
        "gpu",
        "--no-rebuild",
        "--manifest",
        &manifest,
        "--bundle",
        "bundle",
        "--wheels",
        "wheels",
        "--cache-dir",
        "cache",
    ];
    let text = session_in(root, &check);
    settings.bind(|| insta::assert_snapshot!("release_check_with_failed_gates", text));
    let json = session_in(root, &[&check[..], &["--json"]].concat());
    settings.bind(|| insta::assert_snapshot!("release_check_with_failed_gates_json", json));
}

/// Bundles the default library's kernels `only` (comma-separated) into `out`, from the warm
/// build cache.
fn bundle_only(only: &str, out: &str) {
    let built = session(&[
        "dev",
        "bundle-kernels",
        "--quiet",
        "--only",
        only,
        "--out",
        out,
    ]);
    assert!(built.contains("exit code: 0"), "{built}");
}

/// A stand-in for sccache's client on a farm of one server (`127.0.0.1:10501`): it runs each
/// compile it is handed here and counts it, one line each in `$SCCACHE_DIR/compiles`, as a
/// stage of that server; `--dist-status` names a scheduler, `--show-stats` gives the counts as
/// sccache's JSON. Compiles run in parallel: each appends its own line (one small `O_APPEND`
/// write) rather than reading and rewriting a number, which lost a count when two raced.
const FARM_OF_ONE: &str = r#"#!/bin/sh
count="$SCCACHE_DIR/compiles"
case "$1" in
--dist-status) echo '{"SchedulerStatus":["http://127.0.0.1:10600/",{"num_servers":1}]}' ;;
--show-stats)
  n=0
  if [ -f "$count" ]; then n=$(wc -l < "$count" | tr -d ' '); fi
  printf '{"stats":{"compilations":%s,"non_cacheable_compilations":0,"dist_errors":0,"dist_compiles":{"127.0.0.1:10501":%s},"cache_hits":{"counts":{}}}}\n' "$n" "$n" ;;
*)
  echo compile >> "$count"
  exec "$@" ;;
esac
"#;

/// `dev bundle-kernels` of one kernel through a build farm (an sccache stand-in,
/// [`FARM_OF_ONE`]) and a remote cache (the loopback store) from an empty build cache (a farm
/// build uploads nothing), from another empty one with the remote cache only (it uploads),
/// and from a third (the remote cache serves every cubin): the farm's lines and the remote
/// cache's, as a user reads them.
#[test]
fn bundle_kernels_through_a_farm_and_a_remote_cache() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let root = dir.path();
    std::fs::create_dir_all(root.join("library")).unwrap();
    std::fs::write(
        root.join("library/scale.cu"),
        "extern \"C\" __global__ void scale(float* out, int n) {\n  if (threadIdx.x < n) \
         out[threadIdx.x] *= 2.0f;\n}\n",
    )
    .unwrap();
    std::fs::write(
        root.join("library/kernels.toml"),
        "[library]\npackage = \"farmed\"\narchs = [\"sm_90a\", \"sm_100a\", \"compute_90\"]\n\
         cuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n\n[kernels.scale]\nsources = \
         [\"scale.cu\"]\nentries = [\"scale\"]\n",
    )
    .unwrap();
    let sccache = root.join("sccache");
    std::fs::write(&sccache, FARM_OF_ONE).unwrap();
    std::fs::set_permissions(
        &sccache,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::create_dir(root.join("farm-state")).unwrap();
    let store = testkit::loopback_store::LoopbackStore::start();
    let build = |cache: &str, farm: bool| {
        let mut command = kwheel();
        command
            .current_dir(root)
            .env_remove("RUST_LOG")
            .env_remove("KWHEEL_REMOTE_CACHE")
            .env("XDG_CONFIG_HOME", root.join("no-config"))
            .env("KWHEEL_SCCACHE", &sccache)
            .env("SCCACHE_DIR", root.join("farm-state"));
        let url = store.url();
        let mut args = vec![
            "dev",
            "bundle-kernels",
            "--quiet",
            "--manifest",
            "library/kernels.toml",
            "--out",
            "bundle",
            "--cache-dir",
            cache,
            "--remote-cache",
        ];
        args.push(&url);
        if farm {
            args.push("--farm");
        }
        transcript(command, &args)
    };
    let mut settings = settings();
    settings.add_filter(&testkit::literal_pattern(&store.url()), "[STORE]");
    let farmed = build("cache", true);
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_through_a_farm", farmed));
    let remote = build("another-cache", false);
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_into_a_remote_cache", remote));
    let served = build("a-third-cache", false);
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_from_a_remote_cache", served));
}

/// `release diff` of a bundle against one that adds a kernel the manifest keeps to one arch,
/// both ways and as `--json`: the new kernel's skipped targets once read as `unchanged`; they
/// are `skipped`, with the kind of the skip.
#[test]
fn release_diff_of_a_new_kernels_skipped_targets_says_skipped_not_unchanged() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let settings = settings();
    let swiglu = dir.path().join("swiglu").display().to_string();
    let with_wgmma = dir.path().join("with-wgmma").display().to_string();
    bundle_only("swiglu", &swiglu);
    bundle_only("swiglu,wgmma_matmul_bf16", &with_wgmma);
    let added = session(&["release", "diff", &swiglu, &with_wgmma]);
    settings.bind(|| insta::assert_snapshot!("release_diff_of_a_new_kernel_with_skips", added));
    let removed = session(&["release", "diff", &with_wgmma, &swiglu]);
    settings
        .bind(|| insta::assert_snapshot!("release_diff_of_a_removed_kernel_with_skips", removed));
    let json = session(&["release", "diff", &swiglu, &with_wgmma, "--json"]);
    settings.bind(|| insta::assert_snapshot!("release_diff_of_a_new_kernel_with_skips_json", json));
}

/// What a user reads from commands on bundles of the default library's kernels (from the
/// warm build cache) when something is off: `dev coverage`'s refusals, `jit import` of a pack
/// that does not fit the bundle, `release diff` of two bundles, `dev build-wheel`'s hint on a
/// stale bundle, and `dev bundle-kernels`' `--require` error and its "built for no target"
/// error.
#[test]
fn refusals_and_reports_on_a_bundle() {
    let Some(dir) = folder_with_toolchains() else {
        return;
    };
    let root = dir.path();
    let mut settings = settings();
    settings.add_filter(
        &testkit::literal_pattern(&root.display().to_string()),
        "[ROOT]",
    );
    // Bundles of `swiglu`, and of `swiglu` and `sigmoid_gate`, from the warm build cache.
    let swiglu = root.join("swiglu").display().to_string();
    let both = root.join("both").display().to_string();
    bundle_only("swiglu", &swiglu);
    bundle_only("swiglu,sigmoid_gate", &both);
    let bundle = swiglu.clone();

    // `dev coverage`: a CUDA build the bundle lacks, a device nothing loads on, a fleet with
    // an unknown device.
    let cases: [(&str, &[&str]); 3] = [
        (
            "dev_coverage_refuses_a_cuda_build_the_bundle_lacks",
            &["--device", "sm_90", "--cuda", "12.8"],
        ),
        (
            "dev_coverage_of_a_device_nothing_loads_on",
            &["--device", "8.6", "--cuda", "12.9"],
        ),
        (
            "dev_coverage_refuses_an_unknown_fleet_device",
            &["--fleet", "H100,Foo", "--cuda", "13.0"],
        ),
    ];
    for (name, args) in cases {
        let text = session(&[&["dev", "coverage", &bundle][..], args].concat());
        settings.bind(|| insta::assert_snapshot!(name, text));
    }

    // `jit import` into the bundle of a pack of another package, and of one compiled from
    // other sources.
    let pack = |name: &str, json: &str| {
        std::fs::create_dir(root.join(name)).unwrap();
        std::fs::write(root.join(name).join("pack.json"), json).unwrap();
    };
    pack(
        "other-package",
        r#"{"format":1,"package":"other-kernels","torch":"2.13.*","kernels":{}}"#,
    );
    pack(
        "other-sources",
        r#"{"format":1,"package":"af3-kernels","torch":"2.13.*","kernels":{"swiglu":{"inputs":"0000","variants":[]}}}"#,
    );
    for (name, pack) in [
        ("jit_import_of_another_packages_pack", "other-package"),
        ("jit_import_of_a_pack_from_other_sources", "other-sources"),
    ] {
        let text = session_in(
            root,
            &[
                "jit",
                "import",
                pack,
                "--package",
                &bundle,
                "--jit-cache",
                "jit",
            ],
        );
        settings.bind(|| insta::assert_snapshot!(name, text));
    }

    // `release diff`: the `swiglu` bundle against one that adds `sigmoid_gate`, and a bundle
    // against itself.
    let diff = session(&["release", "diff", &swiglu, &both]);
    settings.bind(|| insta::assert_snapshot!("release_diff", diff));
    let same = session(&["release", "diff", &both, &both]);
    settings.bind(|| insta::assert_snapshot!("release_diff_of_a_bundle_and_itself", same));
    let fleet = session(&["release", "diff", &swiglu, &both, "--fleet", "H100,B200"]);
    settings.bind(|| insta::assert_snapshot!("release_diff_fleet", fleet));
    let json = session(&["release", "diff", &swiglu, &both, "--json"]);
    settings.bind(|| insta::assert_snapshot!("release_diff_json", json));

    // `dev build-wheel` of the whole library from the `swiglu` bundle: stale, with a hint.
    let stale = session(&[
        "dev",
        "build-wheel",
        "--bundle",
        &swiglu,
        "--out",
        &format!("{root}/wheels", root = root.display()),
    ]);
    settings.bind(|| insta::assert_snapshot!("dev_build_wheel_stale_bundle_hint", stale));

    // `dev bundle-kernels --require` of a kernel that skips targets, and a kernel narrowed to
    // an arch the library does not build: built for no target.
    let required = session(&[
        "dev",
        "bundle-kernels",
        "--quiet",
        "--require",
        "--only",
        "wgmma_matmul_bf16",
        "--out",
        &format!("{}/required", root.display()),
    ]);
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_require", required));
    let library = copy_library(&root.join("narrowed"));
    let manifest = library.join("kernels.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\narch = [\"sm_90a\"]\n"), "{text}");
    std::fs::write(
        &manifest,
        text.replace("\narch = [\"sm_90a\"]\n", "\narch = [\"sm_80\"]\n"),
    )
    .unwrap();
    let no_target = session_in(
        root,
        &[
            "dev",
            "bundle-kernels",
            "--quiet",
            "--only",
            "wgmma_matmul_bf16",
            "--manifest",
            &manifest.display().to_string(),
            "--out",
            "no-target",
        ],
    );
    settings.bind(|| insta::assert_snapshot!("bundle_kernels_built_for_no_target", no_target));
}
