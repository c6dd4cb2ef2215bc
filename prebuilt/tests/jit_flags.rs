//! A bundle can never steer the compiler (case 2 of the hardening list) and the JIT reads its
//! inputs checked (case 9), tried the way an attacker would: the fixture bundle with its index
//! edited to carry `-MD -MF <dir>/pwned` or `--compiler-bindir=<dir>` (a folder whose `gcc`
//! writes a file when run), loaded through the registry on a device nothing prebuilt fits, and
//! compiled with the JIT directly. Where the CUDA 13.0 nvcc is installed, the same flags are
//! first given to nvcc by hand, to show that they do write the file and run the program.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use prebuilt::device::DriverVersion;
use prebuilt::driver::DriverError;
use prebuilt::registry::{Device, DeviceFacts, LoadedModule, ModuleFailure};

use common::*;

/// Compute 8.0 behind a 13.0 driver: none of the fixture's sm_90a/sm_100a cubins fits, so
/// every load goes to the JIT. Loading anything is a failure of the test.
struct NoFitDevice;

impl Device for NoFitDevice {
    fn facts(&self, _ordinal: u32) -> Result<DeviceFacts, DriverError> {
        Ok(DeviceFacts {
            capability: (8, 0),
            driver: DriverVersion {
                major: 13,
                minor: 0,
            },
        })
    }

    fn load(
        &self,
        _ordinal: u32,
        _image: &[u8],
        _symbols: &[&str],
    ) -> Result<Arc<dyn LoadedModule>, ModuleFailure> {
        panic!("a refused kernel was loaded");
    }
}

/// A folder holding `gcc` (and `cc`, `g++`, `c++`), a script that writes `marker` when run.
fn evil_bindir(dir: &Path, marker: &Path) -> PathBuf {
    let bindir = dir.join("evil");
    fs::create_dir_all(&bindir).unwrap();
    for name in ["gcc", "g++", "cc", "c++"] {
        let script = bindir.join(name);
        fs::write(
            &script,
            format!("#!/bin/sh\necho ran >> '{}'\nexit 1\n", marker.display()),
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    }
    bindir
}

/// The fixture bundle under `dir` with every kernel's `nvcc_flags` set to `flags`.
fn bundle_with_nvcc_flags(dir: &Path, flags: &[String]) -> PathBuf {
    let root = fixture_bundle(dir);
    let mut index = Bundle::open(&root).unwrap().index().clone();
    for record in index.kernels.values_mut() {
        record.inputs.nvcc_flags = flags.to_vec();
    }
    write_index(&root, &index);
    root
}

/// The two attacks: the flags, and the file each would create.
fn attacks(dir: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let pwned = dir.join("x").join("pwned");
    fs::create_dir_all(pwned.parent().unwrap()).unwrap();
    let marker = dir.join("evil-ran");
    let bindir = evil_bindir(dir, &marker);
    vec![
        (
            vec!["-MD".into(), "-MF".into(), pwned.display().to_string()],
            pwned,
        ),
        (
            vec![format!("--compiler-bindir={}", bindir.display())],
            marker,
        ),
    ]
}

#[test]
fn case_2_the_attack_flags_are_real() {
    let Some(nvcc) = nvcc_13_0() else { return };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("kernels.cu");
    fs::write(&source, FIXTURE_SOURCE).unwrap();
    for (flags, written) in attacks(dir.path()) {
        let _ = Command::new(&nvcc)
            .args(["-cubin", "-arch=sm_90a"])
            .args(&flags)
            .arg("-o")
            .arg(dir.path().join("k.cubin"))
            .arg(&source)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            written.exists(),
            "nvcc {flags:?} did not write {}: the control is not an attack",
            written.display()
        );
    }
}

#[test]
fn case_2_bundle_flags_never_run_a_program_or_write_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let nvcc = nvcc_13_0();
    for (n, (flags, written)) in attacks(dir.path()).into_iter().enumerate() {
        let case = dir.path().join(format!("case-{n}"));
        let bundle = bundle_with_nvcc_flags(&case, &flags);
        let cache = case.join("jit-cache");
        let mut options = options(Some("cu130"), JitPolicy::Allowed, &cache);
        // The search finds the real nvcc where it is installed, so that only the allowlist
        // stands between the bundle and the compiler.
        options.compilers = CompilerSearch {
            nvrtc: None,
            site_packages: Vec::new(),
            cuda_home: nvcc
                .as_ref()
                .map(|nvcc| nvcc.parent().unwrap().parent().unwrap().to_path_buf()),
            path: None,
            system_library_path: false,
        };
        let registry = Registry::open_on(&bundle, options, Arc::new(NoFitDevice), None).unwrap();
        let refused = format!("nvcc_flags holds `{}`", flags[0]);
        for kernel in FIXTURE_KERNELS.map(|(name, _)| name) {
            match &registry.status()[kernel] {
                Status::Unavailable { reason } => assert!(
                    reason.contains(&format!(
                        "`{kernel}` is not compiled from its shipped sources"
                    )) && reason.contains(&refused)
                        && reason.contains("docs/jit.md"),
                    "{reason}"
                ),
                other => panic!("{kernel} with {flags:?}: {other:?}"),
            }
            let error = registry.load(kernel).unwrap_err();
            let message = error_chain(&error);
            assert!(matches!(error, LoadError::Jit { .. }), "{message}");
            assert!(message.contains(&refused), "{message}");
        }
        // The JIT itself refuses too, before it looks at its cache or runs anything.
        if let Some(nvcc) = &nvcc {
            let compiler = JitCompiler::nvcc_at(nvcc).unwrap();
            let opened = Bundle::open(&bundle).unwrap();
            let request = jit_request(&opened, JIT_KERNEL, arch("sm_90a"), build("cu130"));
            let error = compile_cached(&request, &compiler, &cache).unwrap_err();
            assert!(error.to_string().contains(&refused), "{error}");
        }
        assert!(
            !written.exists(),
            "{flags:?} wrote {} through the JIT",
            written.display()
        );
        assert!(!cache.exists(), "nothing is cached for a refused kernel");
    }
}

#[test]
fn case_2_allowed_flags_still_compile() {
    let Some(nvcc) = nvcc_13_0() else { return };
    let dir = tempfile::tempdir().unwrap();
    let flags: Vec<String> = ["-lineinfo", "-Xptxas", "-v", "-maxrregcount=64"]
        .map(String::from)
        .to_vec();
    let bundle = bundle_with_nvcc_flags(dir.path(), &flags);
    let compiler = JitCompiler::nvcc_at(&nvcc).unwrap();
    let opened = Bundle::open(&bundle).unwrap();
    let request = jit_request(&opened, JIT_KERNEL, arch("sm_90a"), build("cu130"));
    let output = compile_cached(&request, &compiler, &dir.path().join("jit-cache"))
        .unwrap_or_else(|error| panic!("{}", error_chain(&error)));
    assert!(output.compiled);
    assert_eq!(output.functions.len(), 2);
}

#[test]
fn case_9_a_fifo_source_fails_the_load_at_once() {
    let Some(nvcc) = nvcc_13_0() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bundle = fixture_bundle(dir.path());
    // A header the index does not list, which the compiler would open and wait on.
    let fifo = bundle.join(SOURCES_DIR).join("unlisted.cuh");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let mut options = options(Some("cu130"), JitPolicy::Allowed, &dir.path().join("jit"));
    options.compilers = CompilerSearch {
        nvrtc: None,
        site_packages: Vec::new(),
        cuda_home: Some(nvcc.parent().unwrap().parent().unwrap().to_path_buf()),
        path: None,
        system_library_path: false,
    };
    let registry = Registry::open_on(&bundle, options, Arc::new(NoFitDevice), None).unwrap();
    let started = Instant::now();
    let error = registry.load(JIT_KERNEL).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    let message = error_chain(&error);
    assert!(
        message.contains("unlisted.cuh") && message.contains("not a regular file"),
        "{message}"
    );
}
