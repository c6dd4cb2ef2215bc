//! `kwheel pep517 …`, the build backend's side of PEP 517: the one JSON object each verb
//! prints (snapshotted: it is the contract `kwheel/build.py` reads), and what it wrote.
//!
//! After a deliberate change of an answer: `INSTA_UPDATE=always cargo test --release --test
//! cli pep517` rewrites the `.snap` files, to be reviewed in the diff.

use super::*;

const WHEEL: &str = "af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl";

/// Runs `kwheel pep517 verb --manifest kernels.toml args` in the library's folder, as pip runs
/// the backend in the project's, which must pass and print exactly one line on stdout: the
/// JSON answer.
fn answer(library: &Path, args: &[&str], env: &[(&str, &Path)]) -> serde_json::Value {
    let mut command = kwheel();
    command
        .current_dir(library)
        .arg("pep517")
        .args(args)
        .args(["--manifest", "kernels.toml"]);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let out = stdout(&output);
    assert_eq!(out.lines().count(), 1, "one line, the answer: {out}");
    serde_json::from_str(&out).unwrap_or_else(|error| panic!("not JSON ({error}): {out}"))
}

fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in testkit::snapshot_filters() {
        settings.add_filter(&pattern, replacement);
    }
    settings.set_prepend_module_to_snapshot(false);
    settings
}

fn pretty(answer: &serde_json::Value) -> String {
    serde_json::to_string_pretty(answer).unwrap()
}

fn verify(path: &Path) -> String {
    let output = kwheel()
        .args(["wheel", "verify"])
        .arg(path)
        .output()
        .unwrap();
    let text = stdout(&output);
    assert!(output.status.success(), "{text}{}", stderr(&output));
    text
}

/// The environment of a machine without CUDA toolchains (`KWHEEL_TOOLCHAINS` names an empty
/// place), whatever this one has.
fn no_toolchains(dir: &Path) -> Command {
    let mut command = kwheel();
    command
        .env("KWHEEL_TOOLCHAINS", dir.join("no-toolchains"))
        .env_remove("KWHEEL_CUDA_CU129")
        .env_remove("KWHEEL_CUDA_CU130");
    command
}

#[test]
fn each_hook_answers_in_one_json_line_and_the_metadata_is_the_wheels() {
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let wheels = dir.path().join("wheels");
    let wheels_arg = wheels.to_str().unwrap();
    let built = answer(
        &library,
        &["build-wheel", "--wheel-directory", wheels_arg],
        &[],
    );
    settings().bind(|| insta::assert_snapshot!("pep517_build_wheel", pretty(&built)));
    assert_eq!(built["path"], wheels.join(WHEEL).to_str().unwrap());
    let verified = verify(&wheels.join(WHEEL));
    assert!(
        verified.contains("0 variants verified, sources shipped"),
        "{verified}"
    );

    // The .dist-info pip reads before building is the built wheel's, RECORD left out.
    let metadata = dir.path().join("metadata");
    let prepared = answer(
        &library,
        &[
            "prepare-metadata",
            "--metadata-directory",
            metadata.to_str().unwrap(),
        ],
        &[],
    );
    settings().bind(|| insta::assert_snapshot!("pep517_prepare_metadata", pretty(&prepared)));
    let dist_info = prepared["dist_info"].as_str().unwrap();
    let from_wheel = dir.path().join("from-wheel");
    release::wheel::unpack_dist_info(&wheels.join(WHEEL), &from_wheel).unwrap();
    let mut listed: Vec<String> = std::fs::read_dir(metadata.join(dist_info))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, ["METADATA", "WHEEL"]);
    for name in &listed {
        assert_eq!(
            std::fs::read(metadata.join(dist_info).join(name)).unwrap(),
            std::fs::read(from_wheel.join(dist_info).join(name)).unwrap(),
            "{name}"
        );
    }

    let sdists = dir.path().join("sdist");
    let sdist = answer(
        &library,
        &["build-sdist", "--sdist-directory", sdists.to_str().unwrap()],
        &[],
    );
    settings().bind(|| insta::assert_snapshot!("pep517_build_sdist", pretty(&sdist)));
    assert!(verify(&sdists.join("af3_kernels-0.1.0.tar.gz")).ends_with("ok\n"));
}

#[test]
fn prebuilt_without_toolchains_builds_the_jit_wheel_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let wheels = dir.path().join("wheels");
    let output = no_toolchains(dir.path())
        .current_dir(&library)
        .args(["pep517", "build-wheel", "--prebuilt", "--wheel-directory"])
        .arg(&wheels)
        .args(["--manifest", "kernels.toml"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let built: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    settings()
        .bind(|| insta::assert_snapshot!("pep517_prebuilt_without_toolchains", pretty(&built)));
    assert_eq!(built["prebuilt"], false);
    // The same reason, for the person watching pip's output.
    let reason = built["jit_reason"].as_str().unwrap();
    assert!(stderr(&output).contains(reason), "{}", stderr(&output));
    assert!(verify(&wheels.join(WHEEL)).contains("0 variants verified, sources shipped"));
}

#[test]
fn prebuilt_with_toolchains_ships_the_cubins() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    let wheels = dir.path().join("wheels");
    let built = answer(
        &library,
        &[
            "build-wheel",
            "--prebuilt",
            "--wheel-directory",
            wheels.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(built["prebuilt"], true, "{built}");
    assert_eq!(built["jit_reason"], serde_json::Value::Null, "{built}");
    let verified = verify(&wheels.join(WHEEL));
    assert!(!verified.contains(" 0 variants verified"), "{verified}");
}

#[test]
fn a_broken_manifest_fails_the_hook_with_the_error_and_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let library = copy_library(dir.path());
    append_line(&library.join("kernels.toml"), "[broken");
    let output = no_toolchains(dir.path())
        .current_dir(&library)
        .args(["pep517", "build-wheel", "--prebuilt", "--wheel-directory"])
        .arg(dir.path().join("wheels"))
        .args(["--manifest", "kernels.toml"])
        .output()
        .unwrap();
    let text = failed(&output);
    assert_eq!(stdout(&output), "", "no answer on failure");
    assert!(text.contains("kernels.toml"), "{text}");
}

/// A project folder (`dir/project`) beside a library copy (`dir/kernels`), with a link
/// `project/linked` to the library; and each way of naming the library's manifest, outside the
/// project, with what is said of it: an absolute path, a `..` path and a path through the link.
fn project_and_manifests_outside(dir: &Path) -> (PathBuf, Vec<(String, &'static str)>) {
    let library = copy_library(dir);
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::os::unix::fs::symlink(&library, project.join("linked")).unwrap();
    let absolute = library.join("kernels.toml").display().to_string();
    let outside = vec![
        (absolute, "is absolute"),
        ("../kernels/kernels.toml".to_owned(), "has a `..` component"),
        (
            "linked/kernels.toml".to_owned(),
            "leads out of the project through a symbolic link",
        ),
    ];
    (project, outside)
}

/// A project folder beside a library copy (`dir/kernels`): its manifest outside the project,
/// given as `[tool.kwheel] manifest` = each of an absolute path, a `..` path and a path
/// through a link leading out. Each is refused naming the setting, with the verification
/// exit code, before anything is built: no wheel, no sdist, no metadata.
#[test]
fn a_manifest_outside_the_project_is_refused_by_kwheel_pep517() {
    let dir = tempfile::tempdir().unwrap();
    let (project, outside) = project_and_manifests_outside(dir.path());
    let out = dir.path().join("out");
    for (manifest, reason) in outside {
        for verb in [
            &["build-wheel", "--wheel-directory"][..],
            &["prepare-metadata", "--metadata-directory"],
            &["build-sdist", "--sdist-directory"],
        ] {
            let output = no_toolchains(dir.path())
                .current_dir(&project)
                .arg("pep517")
                .args(verb)
                .arg(&out)
                .args(["--manifest", manifest.as_str()])
                .output()
                .unwrap();
            assert_eq!(output.status.code(), Some(4), "{}", text(&output));
            assert_eq!(stdout(&output), "", "no answer on failure");
            let message = stderr(&output);
            assert!(
                message.contains(&format!("`[tool.kwheel] manifest` `{manifest}` {reason}")),
                "{verb:?}: {message}"
            );
            assert!(!out.exists(), "{verb:?} wrote into {}", out.display());
        }
    }
}

/// `kwheel.build`, the backend pip imports, refuses the same before it runs any command: its
/// `build_wheel` in a project whose `pyproject.toml` names a manifest outside it fails naming
/// `[tool.kwheel] manifest`, and `kwheel` (here a script that records being run) never runs.
#[test]
fn a_manifest_outside_the_project_is_refused_by_the_python_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (project, outside) = project_and_manifests_outside(dir.path());
    std::fs::write(project.join("kernels.toml"), "").unwrap();
    let ran = dir.path().join("ran");
    let command = dir.path().join("kwheel-recorder");
    std::fs::write(
        &command,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", ran.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &command,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let backend = testkit::workspace().join("prebuilt/python/kwheel/build.py");
    let inside = ("kernels.toml".to_owned(), "");
    for (manifest, reason) in outside.into_iter().chain([inside]) {
        std::fs::write(
            project.join("pyproject.toml"),
            format!("[tool.kwheel]\nmanifest = {manifest:?}\n"),
        )
        .unwrap();
        let output = Command::new("python3")
            .current_dir(&project)
            .env("KWHEEL_COMMAND", &command)
            .args([
                "-c",
                "import importlib.util, sys\n\
                 spec = importlib.util.spec_from_file_location('backend', sys.argv[1])\n\
                 backend = importlib.util.module_from_spec(spec)\n\
                 spec.loader.exec_module(backend)\n\
                 try:\n    backend.build_wheel(sys.argv[2])\n\
                 except backend.BuildError as error:\n    print(error)\n",
            ])
            .arg(&backend)
            .arg(dir.path().join("wheels"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output));
        let said = stdout(&output);
        if reason.is_empty() {
            // Inside the project: the command runs (and, being the recorder, fails).
            assert!(ran.exists(), "{said}");
            assert!(said.contains("failed (exit 1)"), "{said}");
            continue;
        }
        assert!(
            said.contains(&format!("`[tool.kwheel] manifest` `{manifest}` {reason}")),
            "{said}"
        );
        assert!(!ran.exists(), "kwheel ran for {manifest}");
    }
}

fn append_line(path: &Path, line: &str) {
    let mut text = std::fs::read_to_string(path).unwrap();
    text.push('\n');
    text.push_str(line);
    text.push('\n');
    std::fs::write(path, text).unwrap();
}
