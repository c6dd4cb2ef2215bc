//! The JIT fallback for extension modules, for real on a CPU: the stable-ABI fixture's wheel,
//! its index narrowed to a torch newer than the installed 2.11 (as a wheel built for torch
//! 2.12 would be), imported next to the pinned torch with an empty JIT cache.

use super::*;

/// Imports `kwtest_ops` and checks its op against torch's `a * x + y`; prints what
/// `provenance()` says of the module.
const IMPORT_SCRIPT: &str = r#"
import json, torch, kwtest_ops, kwheel
x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
y = torch.randn(4096, generator=torch.Generator().manual_seed(1))
out = torch.ops.kwtest.axpby(x, y, 2.5)
print(json.dumps({
    "equal": torch.equal(out, 2.5 * x + y),
    "modules": [(p["kernel"], p["source"], p["reason"]) for p in kwheel.provenance()],
}))
"#;

/// The `kernels.idx` of `bundle` with every module variant serving torch `>=2.12` only.
fn index_for_a_newer_torch(bundle: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(bundle.join("index.json")).unwrap();
    let mut index: prebuilt::Index = serde_json::from_str(&text).unwrap();
    for record in index.modules.values_mut() {
        for variant in &mut record.variants {
            variant.torch = ">=2.12".into();
        }
    }
    prebuilt::lookup::encode(&index)
}

/// A `python -c IMPORT_SCRIPT` with the installed library and the pinned torch on its path,
/// `cuda_home`'s nvcc and the JIT cache `cache`.
fn import_command(
    python: &Path,
    path: &std::ffi::OsStr,
    cuda_home: &Path,
    cache: &Path,
) -> Command {
    let mut command = python_command(python);
    command
        .env("PYTHONPATH", path)
        .env("CUDA_HOME", cuda_home)
        .env("KWHEEL_JIT_CACHE", cache)
        .env_remove("KWTEST_OPS_JIT_FALLBACK")
        .args(["-W", "ignore", "-c", IMPORT_SCRIPT]);
    command
}

/// Every file under `dir`, by name.
fn files_under(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return names;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            names.extend(files_under(&path));
        } else {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    names
}

/// The issue's criteria: no shipped build fits → `<PACKAGE>_JIT_FALLBACK=0` names the torch,
/// the CUDA build and what to install; a builder killed mid-build leaves no entry and no lock
/// that blocks; then 8 processes importing at once build the module exactly once with the
/// cu130 nvcc and g++, and the op each of them calls equals torch's.
#[test]
fn a_module_with_no_fitting_build_is_built_once_by_the_jit_fallback() {
    let Some(runtime) = runtime() else { return };
    let Some(torch) = torch_site() else { return };
    let nvcc = match bundler::toolchain::discover("cu130".parse().unwrap()) {
        Ok(toolchain) => toolchain.nvcc,
        Err(error) => {
            skip(&format!("no cu130 toolchain: {error}"));
            return;
        }
    };
    let Some(nvcc) = nvcc else {
        skip("the cu130 toolchain has no nvcc");
        return;
    };
    let cuda_home = nvcc.parent().unwrap().parent().unwrap().to_path_buf();
    let root = scratch("module-jit");
    let Some(StableModuleWheel { python, built, .. }) = stable_module_wheel(runtime, &root) else {
        return;
    };
    let bundle = root.join("_prebuilt");
    let names: Vec<String> = entries(&std::fs::read(&built.path).unwrap())
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    // The module's own files ship for the JIT; torch's headers do not.
    for shipped in ["csrc/ops.cpp", "csrc/ops.cu", "csrc/axpby.h"] {
        let name = format!("kwtest_ops/_prebuilt/sources/{shipped}");
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert!(
        !names.iter().any(|name| name.contains("/sources/[")),
        "{names:?}"
    );
    let target = install_into(&python, &root.join("site"), &built.path);
    std::fs::write(
        target.join("kwtest_ops/_prebuilt/kernels.idx"),
        index_for_a_newer_torch(&bundle),
    )
    .unwrap();
    let path = std::env::join_paths([&target, &torch]).unwrap();
    let cache = root.join("jit-cache");
    let _ = std::fs::remove_dir_all(&cache);

    // Forbidden: the error names the torch, its CUDA build, what was shipped and what to do.
    let output = import_command(&python, &path, &cuda_home, &cache)
        .env("KWTEST_OPS_JIT_FALLBACK", "0")
        .output()
        .unwrap();
    let text = output_text(&output);
    assert!(!output.status.success(), "{text}");
    let message = text
        .lines()
        .find(|line| line.starts_with("kwheel.NoFitError") || line.contains("NoFitError:"))
        .unwrap_or_else(|| panic!("a NoFitError: {text}"));
    let torch_version = python_output(
        &python,
        &format!(
            "import sys; sys.path.insert(0, {:?}); import torch; print(torch.__version__)",
            torch.display().to_string()
        ),
    );
    let torch_version = torch_version.trim();
    for part in [
        format!("has no build for torch {torch_version} (cu130) on {}", std::env::consts::ARCH),
        "cu130/x86_64 serves torch >=2.12".to_owned(),
        "KWTEST_OPS_JIT_FALLBACK=0 forbids building it from its shipped sources (nothing was built): install torch>=2.12 (cu130/x86_64), or allow the JIT".to_owned(),
    ] {
        assert!(message.contains(&part), "{part:?} in {message}");
    }
    assert!(files_under(&cache).is_empty(), "{:?}", files_under(&cache));

    // A builder killed mid-build (SIGKILL, while nvcc runs) leaves no entry and no stale lock.
    let started = std::time::Instant::now();
    let mut builder = import_command(&python, &path, &cuda_home, &cache)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(builder.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let read = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(read > 0, "the builder ended before compiling");
        if line.contains("compiling csrc/ops.cu") {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    builder.kill().unwrap();
    builder.wait().unwrap();
    let left = files_under(&cache);
    assert!(
        left.iter().all(|name| name.ends_with(".lock")),
        "a killed builder leaves only its lock file: {left:?}"
    );
    eprintln!("killed the builder after {:?}", started.elapsed());

    // 8 processes at once: one builds, seven wait on the lock and read its entry.
    let started = std::time::Instant::now();
    let children: Vec<_> = (0..8)
        .map(|_| {
            import_command(&python, &path, &cuda_home, &cache)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut built_here = 0;
    let mut progress_lines = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let text = output_text(&output);
        assert!(output.status.success(), "{text}");
        progress_lines += String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|line| line.contains("building extension module `_C`"))
            .count();
        let report: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
        assert_eq!(report["equal"], true, "{report}");
        let module = &report["modules"][0];
        assert_eq!(module[0], "_C", "{report}");
        assert_eq!(module[1], "jit", "{report}");
        if module[2] == "extension module `_C`, built at import by the JIT fallback" {
            built_here += 1;
        } else {
            assert_eq!(
                module[2], "extension module `_C`, read at import from the JIT cache",
                "{report}"
            );
        }
    }
    eprintln!("8 imports, one build, in {:?}", started.elapsed());
    assert_eq!(built_here, 1);
    assert_eq!(progress_lines, 1);
    let entries = files_under(&cache);
    assert_eq!(
        entries.iter().filter(|name| name.ends_with(".so")).count(),
        1,
        "{entries:?}"
    );
    assert!(
        !entries.iter().any(|name| name.ends_with(".tmp")),
        "{entries:?}"
    );
}
