//! The manylinux audit, on ELF files compiled here with the system `cc`.

use super::*;
use crate::writer::small_spec;

/// Compiles `source` into a shared library `name` in `dir` with the system `cc`.
pub(crate) fn compile_shared(
    dir: &Path,
    name: &str,
    source: &str,
    extra: &[&str],
) -> Option<Vec<u8>> {
    if Command::new("cc").arg("--version").output().is_err() {
        skip("no C compiler `cc`");
        return None;
    }
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(std::fs::read(dir.join(name)).unwrap())
}

const NEW_GLIBC: &str = "#define _GNU_SOURCE\n#include <unistd.h>\n\
    int kw_close_all(unsigned first) { return close_range(first, ~0U, 0); }\n";
const OLD_GLIBC: &str =
    "#include <string.h>\nunsigned long kw_length(const char *s) { return strlen(s); }\n";

/// `close_range` is versioned GLIBC_2.34; a glibc older than that cannot provide it.
pub(crate) fn new_glibc_library(dir: &Path) -> Option<Vec<u8>> {
    let bytes = compile_shared(dir, "libnew.so", NEW_GLIBC, &[])?;
    let needs_2_34 = bytes.windows(10).any(|w| w == b"GLIBC_2.34");
    if !needs_2_34 {
        skip("this system's glibc predates close_range@GLIBC_2.34");
        return None;
    }
    Some(bytes)
}

#[test]
fn glibc_2_34_symbol_fails_the_audit_naming_file_library_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = new_glibc_library(dir.path()) else {
        return;
    };
    let violations = audit_elf(
        &MANYLINUX_2_28_X86_64,
        "af3_kernels/_kwheel.abi3.so",
        &bytes,
    );
    let messages: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "af3_kernels/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
          manylinux_2_28 allows (GLIBC_2.28)"
        ]
    );
}

#[test]
fn old_symbols_pass_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = compile_shared(dir.path(), "libold.so", OLD_GLIBC, &[]) else {
        return;
    };
    assert!(audit_elf(&MANYLINUX_2_28_X86_64, "pkg/libold.so", &bytes).is_empty());
    let audit = audit_file(
        &AuditTarget::Policy(&MANYLINUX_2_28_X86_64),
        "pkg/libold.so",
        &bytes,
    );
    assert_eq!(audit.kind, Some(ElfKind::Host));
    // A platform-independent wheel holds no host code at all.
    let audit = audit_file(&AuditTarget::PlatformIndependent, "pkg/libold.so", &bytes);
    assert_eq!(
        audit.violations[0].to_string(),
        "pkg/libold.so is host code, but the wheel is tagged `any` (platform-independent)"
    );
}

#[test]
fn library_outside_the_policy_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    if compile_shared(
        dir.path(),
        "libkwdep.so",
        "int kw_dep(void) { return 7; }\n",
        &[],
    )
    .is_none()
    {
        return;
    }
    let library_dir = format!("-L{}", dir.path().display());
    let Some(bytes) = compile_shared(
        dir.path(),
        "libuses.so",
        "int kw_dep(void);\nint kw_uses(void) { return kw_dep() + 1; }\n",
        &[&library_dir, "-lkwdep"],
    ) else {
        return;
    };
    let messages: Vec<String> = audit_elf(&MANYLINUX_2_28_X86_64, "pkg/libuses.so", &bytes)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        messages,
        ["pkg/libuses.so links `libkwdep.so`, which manylinux_2_28 does not allow (bundle it or \
          link it statically)"]
    );
}

#[test]
fn cubins_are_recognised_and_skipped() {
    let fixtures = workspace().join("prebuilt/tests/fixtures/cubin");
    for name in ["nvrtc129_sm_90a.cubin", "nvcc130_sm_100a.cubin"] {
        let bytes = std::fs::read(fixtures.join(name)).unwrap();
        let audit = audit_file(&AuditTarget::Policy(&MANYLINUX_2_28_X86_64), name, &bytes);
        assert_eq!(audit.kind, Some(ElfKind::Cubin), "{name}");
        assert!(audit.violations.is_empty(), "{name}");
        // Even in a platform-independent wheel: a cubin is not host code.
        let audit = audit_file(&AuditTarget::PlatformIndependent, name, &bytes);
        assert!(audit.violations.is_empty(), "{name}");
    }
}

#[test]
fn writer_refuses_a_wheel_that_fails_the_audit_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bytes) = new_glibc_library(dir.path()) else {
        return;
    };
    let out = dir.path().join("wheels");
    let spec = small_spec(
        &out,
        "manylinux_2_28_x86_64",
        vec![
            WheelFile::from_bytes("demo_kernels/__init__.py", ""),
            WheelFile::from_bytes("demo_kernels/_kwheel.abi3.so", bytes),
        ],
    );
    let error = release::write_wheel(&spec).unwrap_err();
    assert_eq!(
        error.to_string(),
        "`demo_kernels-1.2.0-py3-none-manylinux_2_28_x86_64.whl` fails the manylinux_2_28_x86_64 \
         audit:\n  demo_kernels/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than \
         manylinux_2_28 allows (GLIBC_2.28)"
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "no partial wheel"
    );

    // `linux_x86_64` promises nothing about the system, so the same files pass there.
    let mut unrestricted = spec.clone();
    unrestricted.filename =
        WheelFilename::new("demo-kernels", "1.2.0", "py3", "none", "linux_x86_64").unwrap();
    let written = release::write_wheel(&unrestricted).unwrap();
    let report = verify_wheel(&written).unwrap();
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.host_elfs, ["demo_kernels/_kwheel.abi3.so"]);
}
