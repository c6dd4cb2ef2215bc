//! The kwheel runtime wheel (prebuilt/python) and its Python API, installed into a fresh venv.

use super::*;

use release::audit::ViolationKind;
use release::runtime::{command_path, find_cargo_zigbuild, find_zig, MODULE_PATH};
use release::{
    build_runtime_wheel, NativeCommand, NativeModule, RuntimeArch, RuntimeWheelOptions,
    MANYLINUX_2_28_AARCH64,
};

const RUNTIME_DIST_INFO: &str = "kwheel-0.1.0.dist-info";

/// Where the module and the command are built: `KWHEEL_PYTHON_TARGET_DIR` (`ci/test` keeps
/// it under ~/.cache), else the workspace's `target/kwheel/runtime`, as `release
/// build-kwheel` and `release check` build them (a second run builds nothing). Apart from
/// the workspace's own target directory, whose lock the running `cargo test` holds.
fn module_target_dir() -> PathBuf {
    release::runtime::default_target_dir(&workspace())
}

/// A zig-built `kwheel` wheel, built once per run (as `release build-kwheel` builds it).
struct Runtime {
    built: BuiltWheel,
    bytes: Vec<u8>,
}

fn build_for(arch: RuntimeArch) -> Option<Runtime> {
    if find_cargo_zigbuild().is_none() {
        skip("cargo-zigbuild is not installed (`bash ci/setup` installs it)");
        return None;
    }
    if find_zig().is_none() {
        skip("no zig for cargo-zigbuild (`bash ci/setup` installs ziglang)");
        return None;
    }
    if let Some(target) = release::runtime::missing_rust_target(arch) {
        skip(&format!(
            "no Rust standard library for {target} (`bash ci/setup` adds it)"
        ));
        return None;
    }
    let built = build_runtime_wheel(&RuntimeWheelOptions {
        arch,
        module: NativeModule::Build {
            target_dir: Some(module_target_dir()),
        },
        ..RuntimeWheelOptions::new(workspace(), scratch(&format!("runtime-wheel-{arch}")))
    })
    .unwrap_or_else(|error| panic!("the {arch} kwheel wheel builds: {}", chain(&error)));
    let bytes = std::fs::read(&built.path).unwrap();
    Some(Runtime { built, bytes })
}

/// The x86_64 wheel, the one this machine installs.
fn runtime() -> Option<&'static Runtime> {
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| build_for(RuntimeArch::X86_64))
        .as_ref()
}

/// The aarch64 wheel (cross-compiled: the slowest build of the suite, cached in
/// [`module_target_dir`]).
fn runtime_aarch64() -> Option<&'static Runtime> {
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| build_for(RuntimeArch::Aarch64))
        .as_ref()
}

fn module_bytes(runtime: &Runtime) -> Vec<u8> {
    entries(&runtime.bytes)
        .into_iter()
        .find(|(name, _)| name == MODULE_PATH)
        .map(|(_, data)| data)
        .expect("the module is in the wheel")
}

#[test]
fn runtime_wheel_holds_the_package_and_the_abi3_module_for_glibc_2_28() {
    let Some(runtime) = runtime() else { return };
    assert_eq!(
        runtime.built.filename.to_string(),
        format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_x86_64.whl")
    );
    let names: Vec<String> = entries(&runtime.bytes)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    // Every Python file of the package (the build backend among them), the module, the
    // command; sorted, `.dist-info` last.
    let mut expected = vec![command_path(), MODULE_PATH.to_owned()];
    for entry in std::fs::read_dir(workspace().join("prebuilt/python/kwheel")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".py") {
            expected.push(format!("kwheel/{name}"));
        }
    }
    assert!(expected.contains(&"kwheel/build.py".to_owned()));
    expected.sort();
    expected
        .extend(["METADATA", "WHEEL", "RECORD"].map(|file| format!("{RUNTIME_DIST_INFO}/{file}")));
    assert_eq!(names, expected);
    let command = entries(&runtime.bytes)
        .into_iter()
        .find(|(name, _)| *name == command_path())
        .map(|(_, bytes)| bytes)
        .unwrap();
    assert!(
        audit_elf(&MANYLINUX_2_28_X86_64, &command_path(), &command).is_empty(),
        "the command keeps to manylinux_2_28"
    );
    let wheel = entry(&runtime.bytes, &format!("{RUNTIME_DIST_INFO}/WHEEL"));
    assert!(
        wheel.ends_with("Root-Is-Purelib: false\nTag: cp39-abi3-manylinux_2_28_x86_64\n"),
        "{wheel}"
    );
    let metadata = entry(&runtime.bytes, &format!("{RUNTIME_DIST_INFO}/METADATA"));
    assert!(metadata.contains("Name: kwheel\n"), "{metadata}");
    assert!(metadata.contains("Requires-Python: >=3.9\n"), "{metadata}");
    assert!(!metadata.contains("Requires-Dist"), "{metadata}");
    verify_wheel(&runtime.built.path)
        .unwrap()
        .into_result()
        .unwrap();
}

#[test]
fn zig_built_module_needs_nothing_newer_than_glibc_2_28() {
    let Some(runtime) = runtime() else { return };
    let violations = audit_elf(&MANYLINUX_2_28_X86_64, MODULE_PATH, &module_bytes(runtime));
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn runtime_wheel_builds_twice_to_identical_bytes() {
    let Some(runtime) = runtime() else { return };
    let again = build_runtime_wheel(&RuntimeWheelOptions {
        arch: RuntimeArch::X86_64,
        module: NativeModule::Build {
            target_dir: Some(module_target_dir()),
        },
        ..RuntimeWheelOptions::new(workspace(), scratch("runtime-wheel-again"))
    })
    .unwrap();
    assert_eq!(std::fs::read(&again.path).unwrap(), runtime.bytes);
}

/// glibc's version on this machine, from `getconf`, as (major, minor).
fn host_glibc() -> Option<(u32, u32)> {
    let output = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let (major, minor) = version.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[test]
fn module_linked_without_zig_fails_the_audit_naming_the_symbol_version() {
    match host_glibc() {
        // Rust's standard library takes the GLIBC_2.34 symbols where glibc has them.
        Some(version) if version >= (2, 34) => {}
        other => {
            skip(&format!(
                "this machine's glibc ({other:?}) is older than 2.34, which a plain build \
                 would need"
            ));
            return;
        }
    }
    let target_dir = module_target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The debug profile: the linker, not the optimizer, decides the symbol versions, and
    // it builds in two thirds of the time.
    let output = Command::new(cargo)
        .args(["build", "--locked", "-p", "kwheel-python"])
        .arg("--manifest-path")
        .arg(workspace().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let plain = target_dir.join("debug/lib_kwheel.so");
    let violations = audit_elf(
        &MANYLINUX_2_28_X86_64,
        MODULE_PATH,
        &std::fs::read(&plain).unwrap(),
    );
    let too_new: Vec<&str> = violations
        .iter()
        .filter_map(|violation| match &violation.kind {
            ViolationKind::SymbolVersion {
                version, library, ..
            } if library == "libc.so.6" => Some(version.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        too_new
            .iter()
            .any(|version| ["GLIBC_2.33", "GLIBC_2.34"].contains(version)),
        "{violations:?}"
    );
    let message = violations
        .iter()
        .find(|violation| violation.to_string().contains("GLIBC_2.3"))
        .unwrap()
        .to_string();
    assert!(
        message.starts_with("kwheel/_kwheel.abi3.so needs GLIBC_2.3")
            && message
                .ends_with(" (from libc.so.6), newer than manylinux_2_28 allows (GLIBC_2.28)"),
        "{message}"
    );

    // Packed as the runtime, it fails the writer's audit and leaves no wheel.
    let out = scratch("runtime-wheel-plain");
    let error = build_runtime_wheel(&RuntimeWheelOptions {
        arch: RuntimeArch::X86_64,
        module: NativeModule::Prebuilt(plain),
        command: NativeCommand::Omit,
        ..RuntimeWheelOptions::new(workspace(), &out)
    })
    .unwrap_err();
    assert!(matches!(error, Error::Audit { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with(
            "`kwheel-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl` fails the \
             manylinux_2_28_x86_64 audit:\n  kwheel/_kwheel.abi3.so needs GLIBC_2."
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line
            == "  kwheel/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
                manylinux_2_28 allows (GLIBC_2.28)"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

/// A fresh venv with both wheels installed by pip, offline.
struct Venv {
    python: PathBuf,
    site_packages: PathBuf,
}

fn venv() -> Option<&'static Venv> {
    static VENV: OnceLock<Option<Venv>> = OnceLock::new();
    VENV.get_or_init(|| {
        let runtime = runtime()?;
        let library = shared()?;
        let python = fresh_venv(&scratch("python-venv"))?;
        let output = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--no-index",
                "--no-deps",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .arg(&runtime.built.path)
            .arg(&library.built.path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pip install of both wheels failed:\n{}",
            output_text(&output)
        );
        let site_packages = python_output(&python, "import site; print(site.getsitepackages()[0])");
        Some(Venv {
            python,
            site_packages: PathBuf::from(site_packages.trim()),
        })
    })
    .as_ref()
}

/// A `Command` for the venv's python with the variables the runtime reads cleared.
fn python_command(python: &Path) -> Command {
    let mut command = Command::new(python);
    for variable in [
        "PYTHONPATH",
        "PYTHONHOME",
        "KWHEEL_CUDA_BUILD",
        "AF3_KERNELS_JIT_FALLBACK",
        "VIRTUAL_ENV",
    ] {
        command.env_remove(variable);
    }
    command.env("PYTHONDONTWRITEBYTECODE", "1");
    command
}

fn python_output(python: &Path, code: &str) -> String {
    let output = python_command(python).args(["-c", code]).output().unwrap();
    assert!(
        output.status.success(),
        "python -c {code:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn both_wheels_install_offline_and_import() {
    let Some(venv) = venv() else { return };
    assert!(venv.site_packages.join(MODULE_PATH).is_file());
    assert!(venv
        .site_packages
        .join("af3_kernels/_prebuilt/kernels.idx")
        .is_file());
    assert!(!venv
        .site_packages
        .join("af3_kernels/_prebuilt/index.json")
        .exists());
    assert!(venv
        .site_packages
        .join(RUNTIME_DIST_INFO)
        .join("RECORD")
        .is_file());
    let out = python_output(
        &venv.python,
        "import kwheel, af3_kernels\n\
         print(kwheel.__version__)\n\
         print(af3_kernels._registry.package, len(af3_kernels._registry.kernels))\n",
    );
    assert_eq!(out, format!("{KWHEEL_VERSION}\naf3-kernels 7\n"));
}

#[test]
fn python_api_tests_pass_in_the_venv() {
    let Some(venv) = venv() else { return };
    let tests = workspace().join("prebuilt/python/tests");
    // From the tests' own directory: `-m` puts it first on sys.path, and it holds no
    // `kwheel`, so the installed package is the one imported.
    let output = python_command(&venv.python)
        .args(["-m", "unittest", "-v", "test_kwheel"])
        .current_dir(&tests)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "Python tests failed:\n{report}");
    assert!(
        report.trim_end().ends_with("OK") || report.contains("OK (skipped="),
        "{report}"
    );
    eprintln!("{report}");
}

/// The pinned torch that `ci/setup-torch` installs: `KWHEEL_TORCH`, else
/// `${XDG_CACHE_HOME:-~/.cache}/kwheel/torch`; `None` (skipped, or failed under
/// `KWHEEL_REQUIRE_TOOLCHAINS=1`) where it is not installed.
fn torch_site() -> Option<PathBuf> {
    let dir = match std::env::var_os("KWHEEL_TORCH").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => prebuilt::cache::cache_home().ok()?.join("kwheel/torch"),
    };
    if dir.join("torch/__init__.py").is_file() {
        Some(dir)
    } else {
        skip(&format!(
            "no torch in {} (`bash ci/setup-torch` installs the pinned one)",
            dir.display()
        ));
        None
    }
}

#[test]
fn torch_op_tests_pass_in_the_venv() {
    let Some(venv) = venv() else { return };
    let Some(torch) = torch_site() else { return };
    for (dir, module) in [
        ("prebuilt/python/tests", "test_torch"),
        ("kernels/python/tests", "test_ops"),
    ] {
        let output = python_command(&venv.python)
            .env("PYTHONPATH", &torch)
            .args(["-m", "unittest", "-v", module])
            .current_dir(workspace().join(dir))
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{module} failed:\n{report}");
        // Every test ran: nothing skips for want of torch.
        assert!(report.trim_end().ends_with("OK"), "{report}");
        eprintln!("{report}");
    }
}
/// A fresh venv under `dir` (outside the repository when `dir` is); `None` (skipped)
/// without a Python that makes one.
fn fresh_venv(dir: &Path) -> Option<PathBuf> {
    match Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .output()
    {
        Ok(output) if output.status.success() => Some(dir.join("bin/python")),
        Ok(output) => {
            skip(&format!(
                "python3 -m venv failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
            None
        }
        Err(error) => {
            skip(&format!("no python3: {error}"));
            None
        }
    }
}

/// Installs `wheel` without its dependencies into `target` (`pip install --target`), as a
/// user without a virtual environment does; returns `target`.
fn install_into(python: &Path, target: &Path, wheel: &Path) -> PathBuf {
    pip_install(
        python,
        &[
            "--no-deps".as_ref(),
            "--target".as_ref(),
            target.as_os_str(),
            wheel.as_os_str(),
        ],
    );
    target.to_path_buf()
}

/// `python -m pip install --no-index --disable-pip-version-check <args>`, which must pass.
fn pip_install(python: &Path, args: &[&std::ffi::OsStr]) -> String {
    let output = python_command(python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-index",
            "--disable-pip-version-check",
        ])
        .args(args)
        .output()
        .unwrap();
    let text = output_text(&output);
    assert!(
        output.status.success(),
        "pip install {args:?} failed:\n{text}"
    );
    text
}

#[test]
fn the_kwheel_wheel_puts_kwheel_on_path_and_it_builds_a_library_outside_the_repository() {
    let Some(runtime) = runtime() else { return };
    let Some(shared) = shared() else { return };
    let outside = tempfile::tempdir().unwrap();
    let Some(python) = fresh_venv(&outside.path().join("venv")) else {
        return;
    };
    pip_install(
        &python,
        &["--no-deps".as_ref(), runtime.built.path.as_os_str()],
    );
    let bin = python.parent().unwrap();
    assert!(bin.join("kwheel").is_file(), "pip installs the command");
    let path = std::env::join_paths(std::iter::once(bin.to_owned()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let project = outside.path().join("project");
    copy_library(&project);
    // `kwheel` as a shell finds it on PATH, in a directory that is no kwheel checkout.
    let run = |args: &[&str]| {
        let output = Command::new("kwheel")
            .args(args)
            .env("PATH", &path)
            .current_dir(&project)
            .output()
            .unwrap();
        let text = output_text(&output);
        assert!(output.status.success(), "kwheel {args:?}:\n{text}");
        text
    };
    assert_eq!(run(&["--version"]), format!("kwheel {KWHEEL_VERSION}\n"));
    let cache = shared.cache.to_str().unwrap();
    let bundled = run(&["dev", "bundle-kernels", "--quiet", "--cache-dir", cache]);
    assert!(
        bundled.contains("bundle target/kwheel/_prebuilt"),
        "{bundled}"
    );
    let built = run(&["dev", "build-wheel", "--quiet", "--cache-dir", cache]);
    let wheel = project.join("target/kwheel/wheels").join(WHEEL_NAME);
    assert!(built.starts_with("target/kwheel/wheels/"), "{built}");
    verify_wheel(&wheel).unwrap().into_result().unwrap();
    let only = std::fs::read_dir(project.join("target/kwheel/wheels"))
        .unwrap()
        .count();
    assert_eq!(only, 1, "dev build-wheel builds the library's wheel only");
}

/// What an installed `af3_kernels` says: cubins in its index, `select()`'s answer (or its
/// refusal), `status()` of one kernel.
const REPORT_SCRIPT: &str = r#"
import json, os, af3_kernels, kwheel
variants = str(af3_kernels._registry.path)
sources = os.path.isdir(os.path.join(af3_kernels._registry.path, "sources"))
try:
    chosen = af3_kernels.select("layernorm_bf16", "sm_90", cuda="12.9")
    selected = [str(chosen), chosen.location]
except kwheel.NoFitError as error:
    selected = [None, str(error)]
print(json.dumps([variants, sources, selected, af3_kernels.status()["layernorm_bf16"]]))
"#;

type Report = (usize, bool, (Option<String>, String), String);

fn report(python: &Path) -> Report {
    let scratch = tempfile::tempdir().unwrap();
    let output = python_command(python)
        .args(["-c", REPORT_SCRIPT])
        .current_dir(scratch.path())
        .output()
        .unwrap();
    assert_succeeded(&output);
    // The script gives the bundle's path where the variant count goes: the wheel ships
    // `kernels.idx` only, which Rust decodes.
    let mut value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let bundle = PathBuf::from(value[0].as_str().unwrap());
    let index = prebuilt::lookup::read_bundle_index(&bundle).unwrap();
    let variants: usize = index.kernels.values().map(|k| k.variants.len()).sum();
    value[0] = variants.into();
    serde_json::from_value(value).unwrap()
}

/// The JIT path, as an installed package built from source reports it.
fn assert_jit_path(report: &Report, how: &str) {
    let (variants, sources, (chosen, refusal), status) = report;
    assert_eq!(*variants, 0, "{how}: no cubin");
    assert!(*sources, "{how}: the sources are shipped");
    assert_eq!(*chosen, None, "{how}");
    assert!(
        refusal.contains(release::library::RECIPES_ONLY_REASON),
        "{how}: select() names the JIT path: {refusal}"
    );
    // Without a GPU status() names the missing driver; with one, the compile to come.
    assert!(
        status.contains("compiles on first load")
            || (status.starts_with("unavailable") && status.contains("driver")),
        "{how}: {status}"
    );
}

#[test]
fn pip_builds_the_library_from_its_directory_and_its_sdist_into_the_jit_path() {
    let Some(runtime) = runtime() else { return };
    let Some(shared) = shared() else { return };
    let outside = tempfile::tempdir().unwrap();
    let Some(python) = fresh_venv(&outside.path().join("venv")) else {
        return;
    };
    // Build isolation installs `kwheel` for the backend from the same wheel, offline.
    let find_links = runtime.built.path.parent().unwrap().as_os_str().to_owned();
    let from = |target: &std::ffi::OsStr| {
        pip_install(
            &python,
            &[
                "--find-links".as_ref(),
                &find_links,
                "--no-deps".as_ref(),
                "--force-reinstall".as_ref(),
                target,
            ],
        )
    };
    pip_install(
        &python,
        &["--no-deps".as_ref(), runtime.built.path.as_os_str()],
    );
    let project = outside.path().join("project");
    let manifest = copy_library(&project);
    let directory = from(manifest.parent().unwrap().as_os_str());
    assert!(
        directory.contains("Successfully installed af3-kernels-0.1.0"),
        "{directory}"
    );
    assert_jit_path(&report(&python), "pip install <directory>");

    let sdist = release::build_sdist(&release::SdistOptions {
        manifest: manifest.clone(),
        out: outside.path().join("sdist"),
    })
    .unwrap_or_else(|error| panic!("{}", chain(&error)));
    from(sdist.path.as_os_str());
    assert_jit_path(&report(&python), "pip install <sdist>");

    // The wheel `dev build-wheel` builds instead: prebuilt cubins, in the wheel.
    from(shared.built.path.as_os_str());
    let (variants, _, (chosen, location), status) = report(&python);
    assert!(variants > 0);
    assert_eq!(chosen.as_deref(), Some("cu129/sm_90a"));
    assert_eq!(location, "local (bundle)");
    assert!(
        status.contains("prebuilt")
            || (status.starts_with("unavailable") && status.contains("driver")),
        "{status}"
    );
}

/// PyPA's auditwheel `show` with `args`, as `ci/setup` installs it; `None` (skipped) without
/// it. Its text output has its runs of whitespace made single spaces.
fn auditwheel(wheel: &Path, args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("KWHEEL_AUDITWHEEL")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = prebuilt::cache::cache_home().ok()?;
            Some(cache.join("kwheel/auditwheel"))
        })
        .filter(|dir| dir.join("auditwheel").is_dir());
    let Some(dir) = dir else {
        skip("no auditwheel (`bash ci/setup` installs it)");
        return None;
    };
    let output = Command::new("python3")
        .args(["-m", "auditwheel", "show"])
        .args(args)
        .arg(wheel)
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap();
    let text = output_text(&output);
    assert!(
        output.status.success(),
        "auditwheel show {}:\n{text}",
        wheel.display()
    );
    if args.contains(&"--json") {
        return Some(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[test]
fn auditwheel_accepts_both_kwheel_wheels() {
    for (runtime, arch) in [
        (runtime(), RuntimeArch::X86_64),
        (runtime_aarch64(), RuntimeArch::Aarch64),
    ] {
        let Some(runtime) = runtime else { return };
        let Some(shown) = auditwheel(&runtime.built.path, &[]) else {
            return;
        };
        let tag = arch.platform_tag();
        assert!(
            shown.contains(&format!(
                "consistent with the following platform tag: \"{tag}\""
            )),
            "{shown}"
        );
    }
}

#[test]
fn the_aarch64_wheel_holds_aarch64_code_for_glibc_2_28() {
    let Some(runtime) = runtime_aarch64() else {
        return;
    };
    assert_eq!(
        runtime.built.filename.to_string(),
        format!("kwheel-{KWHEEL_VERSION}-cp39-abi3-manylinux_2_28_aarch64.whl")
    );
    for (name, bytes) in entries(&runtime.bytes) {
        if name == MODULE_PATH || name == command_path() {
            assert_eq!(
                u16::from_le_bytes([bytes[18], bytes[19]]),
                183,
                "{name}: EM_AARCH64"
            );
            let violations = audit_elf(&MANYLINUX_2_28_AARCH64, &name, &bytes);
            assert!(violations.is_empty(), "{violations:?}");
            // The x86_64 policy refuses it, naming the machine.
            assert!(!audit_elf(&MANYLINUX_2_28_X86_64, &name, &bytes).is_empty());
        }
    }
}

/// `qemu-aarch64-static` and the arm64 sysroot `ci/setup` unpacks; `None` (skipped) without.
fn arm64_emulation() -> Option<(PathBuf, PathBuf)> {
    let root = std::env::var_os("KWHEEL_ARM64_ROOT")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = prebuilt::cache::cache_home().ok()?;
            Some(cache.join("kwheel/arm64"))
        })?;
    let qemu = root.join("qemu-aarch64-static");
    let sysroot = root.join("sysroot");
    if qemu.is_file() && sysroot.join("usr/bin/python3.11").is_file() {
        Some((qemu, sysroot))
    } else {
        skip(&format!(
            "no arm64 emulation at {} (`bash ci/setup` unpacks qemu-user and an arm64 Python)",
            root.display()
        ));
        None
    }
}

#[test]
fn the_aarch64_wheel_imports_and_answers_under_emulation() {
    let Some(runtime) = runtime_aarch64() else {
        return;
    };
    let Some(shared) = shared() else { return };
    let Some((qemu, sysroot)) = arm64_emulation() else {
        return;
    };
    // pip installs both wheels for an aarch64 CPython 3.11, as it would on the machine.
    let target = scratch("arm64-site");
    let output = Command::new("python3")
        .args(["-m", "pip", "install", "--no-index", "--no-deps", "--quiet"])
        .args(["--disable-pip-version-check", "--only-binary=:all:"])
        .args([
            "--platform",
            "manylinux_2_28_aarch64",
            "--python-version",
            "3.11",
        ])
        .args(["--implementation", "cp", "--target"])
        .arg(&target)
        .arg(&runtime.built.path)
        .arg(&shared.built.path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "pip install for aarch64:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let script = "import json, platform, kwheel, af3_kernels\n\
                  chosen = af3_kernels.select('layernorm_bf16', 'sm_90', cuda='12.9')\n\
                  print(json.dumps([platform.machine(), kwheel.__version__, str(chosen),\n\
                  af3_kernels.status()['layernorm_bf16']]))\n";
    let output = Command::new(&qemu)
        .arg("-L")
        .arg(&sysroot)
        .arg(sysroot.join("usr/bin/python3.11"))
        .args(["-c", script])
        .env("PYTHONPATH", &target)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONHOME")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "python under qemu-aarch64:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (machine, version, chosen, status): (String, String, String, String) =
        serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(machine, "aarch64");
    assert_eq!(version, KWHEEL_VERSION);
    assert_eq!(chosen, "cu129/sm_90a");
    assert!(
        status.starts_with("unavailable") && status.contains("driver"),
        "{status}"
    );
    // The command from the wheel's scripts runs there too.
    let output = Command::new(&qemu)
        .arg("-L")
        .arg(&sysroot)
        .arg(target.join("bin/kwheel"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("kwheel {KWHEEL_VERSION}\n")
    );
}

/// What an installed `kwtest_ops` answers right after `import`: its op against torch's
/// `a * x + y` on CPU, whether CUDA was initialised, what `provenance()` says of the module, a
/// second open (no second load: a namespace registers once per process), and the refusal of a
/// torch the module does not serve.
const MODULE_SCRIPT: &str = r#"
import json, torch, kwtest_ops, kwheel
x = torch.randn(10000, generator=torch.Generator().manual_seed(0))
y = torch.randn(10000, generator=torch.Generator().manual_seed(1))
out = torch.ops.kwtest.axpby(x, y, 2.5)
again = kwheel.open("kwtest_ops")
try:
    kwheel.Bundle(again.path).read_module("_C", torch="2.10.0+cu130", cuda="13.0", cpu="x86_64")
    refusal = None
except kwheel.NoFitError as error:
    refusal = str(error)
try:
    torch.ops.kwtest.axpby(x, y[:5], 1.0)
    checked = None
except RuntimeError as error:
    checked = str(error).splitlines()[0]
status = again.status()
print(json.dumps({
    "equal": torch.equal(out, 2.5 * x + y),
    "cuda_initialised": torch.cuda.is_initialized(),
    "torch": torch.__version__,
    "status": status,
    "available": [again.is_available("_C"), again.is_available("_C (module)")],
    "reason": again.unavailable_reason("_C (module)"),
    "cuda_initialised_after_status": torch.cuda.is_initialized(),
    "modules": [(p["kernel"], p["variant"], p["source"]) for p in kwheel.provenance()],
    "refusal": refusal,
    "checked": checked,
}))
"#;

/// The stable-ABI fixture's wheel and a venv to install it in.
struct StableModuleWheel {
    /// The venv's Python, with the runtime wheel alone installed.
    python: PathBuf,
    /// The fixture's copy the wheel was built from.
    library: PathBuf,
    /// The library's wheel.
    built: BuiltWheel,
}

/// `testkit/fixtures/stable_module` copied to `<root>/library` and built into its wheel in
/// `<root>/wheels` (its bundle in `<root>/_prebuilt`, its build cache `<root>/cache`): the
/// copy's folder and the wheel.
fn build_stable_module(root: &Path) -> (PathBuf, BuiltWheel) {
    let library = root.join("library");
    testkit::copy_tree(
        &workspace().join("testkit/fixtures/stable_module"),
        &library,
        &[],
    );
    let built = build_library_wheel(&options(
        &library.join("kernels.toml"),
        &root.join("_prebuilt"),
        &root.join("wheels"),
        &root.join("cache"),
    ))
    .unwrap_or_else(|error| panic!("the module library's wheel builds: {}", chain(&error)));
    (library, built)
}

/// [`build_stable_module`] in `root`, and a fresh venv in `<root>/venv` with the runtime wheel
/// alone (the default library's wheel is not needed); `None` (skipped) without a Python that
/// makes a venv.
fn stable_module_wheel(runtime: &Runtime, root: &Path) -> Option<StableModuleWheel> {
    let python = fresh_venv(&root.join("venv"))?;
    pip_install(
        &python,
        &["--no-deps".as_ref(), runtime.built.path.as_os_str()],
    );
    let (library, built) = build_stable_module(root);
    Some(StableModuleWheel {
        python,
        library,
        built,
    })
}

/// The issue's CPU criterion: a library whose op is a LibTorch stable-ABI extension module
/// (`testkit/fixtures/stable_module`: a CPU implementation and a CUDA one) goes through
/// `bundle-kernels` and `build-wheel`, installs with `pip --target`, and next to the pinned
/// torch `torch.ops.kwtest.axpby` equals torch's own `a * x + y` right after `import
/// kwtest_ops`, loaded from the verified bytes without initialising CUDA.
#[test]
fn a_stable_abi_module_op_runs_on_cpu_right_after_import() {
    let Some(runtime) = runtime() else { return };
    let Some(torch) = torch_site() else { return };
    let root = scratch("stable-module");
    let Some(StableModuleWheel {
        python,
        library,
        built,
    }) = stable_module_wheel(runtime, &root)
    else {
        return;
    };
    // Built with this machine's g++ 12 and glibc (and Debian's g++ 12 for aarch64), each
    // module keeps to glibc 2.28 (docs/extensions.md: `__libc_single_threaded` and
    // `pthread_once`).
    assert_eq!(
        built.filename.to_string(),
        "kwtest_ops-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl"
    );
    let names: Vec<String> = entries(&std::fs::read(&built.path).unwrap())
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let module = names
        .iter()
        .find(|name| {
            name.starts_with("kwtest_ops/_prebuilt/artifacts/") && name.ends_with(".so.zst")
        })
        .unwrap_or_else(|| panic!("the module ships compressed: {names:?}"));
    assert!(
        names.contains(&"kwtest_ops/_prebuilt/kernels.idx".to_owned()),
        "{module}"
    );
    // Stored compressed, the module is invisible to an ELF audit of the wheel's files; wheel
    // verify decompresses it, matches its digest and audits it for the wheel's tag.
    let report = release::verify_wheel(&built.path).unwrap();
    assert_eq!(report.bundles[0].modules, 2, "{report}");
    assert!(report.is_ok(), "{report}");
    // Tagged for aarch64 alone, the wheel is refused by its x86_64 module.
    let retagged = root.join("kwtest_ops-0.1.0-py3-none-manylinux_2_28_aarch64.whl");
    let files: Vec<(String, Vec<u8>)> = entries(&std::fs::read(&built.path).unwrap())
        .into_iter()
        .filter(|(name, _)| !name.ends_with("/RECORD"))
        .map(|(name, data)| match name.ends_with(".dist-info/WHEEL") {
            true => {
                let text = String::from_utf8(data).unwrap();
                let kept: Vec<&str> = text
                    .lines()
                    .filter(|line| !line.ends_with("manylinux_2_28_x86_64"))
                    .collect();
                (name, format!("{}\n", kept.join("\n")).into_bytes())
            }
            false => (name, data),
        })
        .collect();
    write_with_record(&retagged, &files, "kwtest_ops-0.1.0.dist-info/RECORD");
    let report = release::verify_wheel(&retagged).unwrap();
    let problems = problems_about(&report, module);
    assert!(
        problems.iter().any(|problem| problem.starts_with(
            "extension module `_C` (cu130/x86_64) is built for x86_64, but no platform tag of \
             the wheel (manylinux_2_28_aarch64) names that CPU: "
        )),
        "{report}"
    );

    let target = install_into(&python, &root.join("site"), &built.path);
    let path = std::env::join_paths([&target, &torch]).unwrap();
    let output = python_command(&python)
        .env("PYTHONPATH", path)
        .args(["-W", "ignore", "-c", MODULE_SCRIPT])
        .current_dir(&root)
        .output()
        .unwrap();
    let text = output_text(&output);
    assert!(output.status.success(), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    assert_eq!(report["equal"], true, "{report}");
    assert_eq!(report["cuda_initialised"], false, "{report}");
    // `status()` lists the module beside the kernels, under the name `bundle list` gives it;
    // on this machine (no NVIDIA driver) NVML cannot say which GPU there is, so the module is
    // available (its CPU op runs) and its archs are named as unchecked. Asking initialises
    // nothing.
    let status = report["status"]["_C (module)"].as_str().unwrap_or_default();
    assert!(
        status.starts_with(&format!(
            "available: module cu130/{arch}: loaded at import (torch {torch}); the device was \
             not checked against its archs (sm_90a, sm_100a): NVML (libnvidia-ml.so.1) could \
             not be loaded: no NVIDIA driver here",
            arch = std::env::consts::ARCH,
            torch = report["torch"].as_str().unwrap_or_default(),
        )),
        "{report}"
    );
    assert_eq!(
        report["available"],
        serde_json::json!([true, true]),
        "{report}"
    );
    assert_eq!(report["reason"], serde_json::Value::Null, "{report}");
    assert_eq!(report["cuda_initialised_after_status"], false, "{report}");
    assert_eq!(
        report["modules"],
        serde_json::json!([["_C", format!("cu130/{}", std::env::consts::ARCH), "module"]])
    );
    assert_eq!(
        report["refusal"],
        "extension module `_C` has no build for torch 2.10.0+cu130 (cu130) on x86_64: \
         cu130/x86_64 serves torch >=2.11; cu130/aarch64 is for aarch64 CPUs; cu129/x86_64 was \
         not built: the cu129 toolchain has no nvcc front end (its wheels carry NVRTC and ptxas \
         only), and a module's host half needs one (docs/extensions.md); cu129/aarch64 was not \
         built: the cu129 toolchain has no nvcc front end (its wheels carry NVRTC and ptxas \
         only), and a module's host half needs one (docs/extensions.md); the JIT fallback was \
         not asked to build it (no torch folder given); install torch>=2.11 (cu130/x86_64)"
    );
    // The library's own check, from its C++ launcher, reaches Python as torch's error, its
    // `__FILE__` relative to the library (never the build machine's folder).
    assert_eq!(
        report["checked"], "axpby_check, csrc/axpby.h:7, axpby: x and y differ in size",
        "{report}"
    );

    // A module whose sources changed since the bundle is not shipped.
    let header = library.join("csrc/axpby.h");
    let text = std::fs::read_to_string(&header).unwrap();
    std::fs::write(&header, text.replace("differ in size", "differ in length")).unwrap();
    let error = build_library_wheel(&options(
        &library.join("kernels.toml"),
        &root.join("_prebuilt"),
        &root.join("wheels"),
        &root.join("cache"),
    ))
    .unwrap_err();
    let text = chain(&error);
    assert!(
        text.contains("_C") && text.contains("file csrc/axpby.h: content changed"),
        "{text}"
    );
}

mod module_aarch64;
mod module_jit;
