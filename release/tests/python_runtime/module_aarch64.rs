//! Extension modules for aarch64 (Grace Hopper, Grace Blackwell hosts), for real: the
//! stable-ABI fixture built on this machine for both CPUs (the aarch64 host code with the
//! cross g++ `ci/setup-aarch64` unpacks, against torch for aarch64), each module audited by
//! PyPA's auditwheel as a plain file, and the wheel installed for aarch64 and imported under
//! emulation next to torch for aarch64, where the op answers right after `import`.

use super::*;

/// What `kwtest_ops` answers under emulation: the machine, its op against torch's
/// `a * x + y` (aarch64's g++ fuses the multiply-add, so equal to within rounding), whether
/// CUDA was initialised, and which module `provenance()` names.
const AARCH64_SCRIPT: &str = r#"
import json, platform, torch, kwtest_ops, kwheel
x = torch.randn(10000, generator=torch.Generator().manual_seed(0))
y = torch.randn(10000, generator=torch.Generator().manual_seed(1))
out = torch.ops.kwtest.axpby(x, y, 2.5)
print(json.dumps({
    "machine": platform.machine(),
    "close": torch.allclose(out, 2.5 * x + y, rtol=1e-6, atol=1e-6),
    "cuda_initialised": torch.cuda.is_initialized(),
    "modules": [(p["kernel"], p["variant"], p["source"]) for p in kwheel.provenance()],
}))
"#;

/// torch for aarch64 as `ci/setup-aarch64` installs it (`KWHEEL_TORCH_AARCH64`); `None`
/// (skipped) without it.
fn torch_aarch64_site() -> Option<PathBuf> {
    let dir = std::env::var_os("KWHEEL_TORCH_AARCH64")
        .map(PathBuf::from)
        .or_else(|| {
            Some(
                prebuilt::cache::cache_home()
                    .ok()?
                    .join("kwheel/torch-aarch64"),
            )
        })
        .filter(|dir| dir.join("torch/lib/libc10.so").is_file());
    if dir.is_none() {
        skip("no torch for aarch64 (`bash ci/setup-aarch64` installs it)");
    }
    dir
}

/// The libraries a module may need outside the manylinux policy: torch's and CUDA's, which
/// the process that loads it has loaded already.
const TORCH_AND_CUDA: [&str; 6] = [
    "libc10.so",
    "libc10_cuda.so",
    "libtorch.so",
    "libtorch_cpu.so",
    "libtorch_cuda.so",
    "libcudart.so.13",
];

#[test]
fn an_aarch64_module_is_built_here_audited_and_runs_under_emulation() {
    let Some(runtime) = runtime_aarch64() else {
        return;
    };
    let Some((qemu, sysroot)) = arm64_emulation() else {
        return;
    };
    let Some(torch) = torch_aarch64_site() else {
        return;
    };
    let root = scratch("aarch64-module");
    let (_, built) = build_stable_module(&root);
    // One module per CPU, so the wheel serves both.
    assert_eq!(
        built.filename.to_string(),
        "kwtest_ops-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl"
    );
    let report = release::verify_wheel(&built.path).unwrap();
    assert_eq!(report.bundles[0].modules, 2, "{report}");
    assert!(report.is_ok(), "{report}");

    // PyPA's auditwheel, on each module as the one file of a wheel: its glibc symbols keep to
    // 2.28 or older, and it needs nothing outside the policy but torch's and CUDA's libraries.
    let bundle = prebuilt::Bundle::open(root.join("_prebuilt")).unwrap();
    let record = &bundle.index().modules["_C"];
    let mut cpus = Vec::new();
    for variant in &record.variants {
        let bytes = prebuilt::module::read_module(bundle.root(), "_C", variant).unwrap();
        let cpu = variant.cpu.clone();
        let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
        assert_eq!(machine, if cpu == "aarch64" { 183 } else { 62 }, "{cpu}");
        let wheel = root.join(format!("modcheck-0.0.0-py3-none-linux_{cpu}.whl"));
        let files = vec![
            ("modcheck/_C.so".to_owned(), bytes),
            (
                "modcheck-0.0.0.dist-info/METADATA".to_owned(),
                b"Metadata-Version: 2.1\nName: modcheck\nVersion: 0.0.0\n".to_vec(),
            ),
            (
                "modcheck-0.0.0.dist-info/WHEEL".to_owned(),
                format!(
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n\
                     Tag: py3-none-linux_{cpu}\n"
                )
                .into_bytes(),
            ),
        ];
        write_with_record(&wheel, &files, "modcheck-0.0.0.dist-info/RECORD");
        let Some(shown) = auditwheel(&wheel, &["--json"]) else {
            return;
        };
        let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
        let sym_tag = shown["sym_tag"].as_str().unwrap_or_default().to_owned();
        let glibc: Vec<u32> = sym_tag
            .trim_start_matches("manylinux_")
            .split('_')
            .take(2)
            .map(|part| part.parse().unwrap())
            .collect();
        assert!(
            sym_tag.ends_with(&format!("_{cpu}")) && glibc[0] == 2 && glibc[1] <= 28,
            "{cpu}: {shown}"
        );
        let external: Vec<&str> = shown["external_libs"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert!(
            external.iter().all(|lib| TORCH_AND_CUDA.contains(lib)),
            "{cpu}: {external:?}"
        );
        cpus.push(cpu);
    }
    cpus.sort();
    assert_eq!(cpus, ["aarch64", "x86_64"]);

    // pip installs both wheels for an aarch64 CPython 3.11, as it would on a Grace host.
    let target = root.join("arm64-site");
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
        .arg(&built.path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", output_text(&output));
    let output = Command::new(&qemu)
        .arg("-L")
        .arg(&sysroot)
        .arg(sysroot.join("usr/bin/python3.11"))
        .args(["-W", "ignore", "-c", AARCH64_SCRIPT])
        .env(
            "PYTHONPATH",
            std::env::join_paths([&target, &torch]).unwrap(),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONHOME")
        .output()
        .unwrap();
    let text = output_text(&output);
    assert!(
        output.status.success(),
        "python under qemu-aarch64:\n{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    assert_eq!(report["machine"], "aarch64", "{report}");
    assert_eq!(report["close"], true, "{report}");
    assert_eq!(report["cuda_initialised"], false, "{report}");
    assert_eq!(
        report["modules"],
        serde_json::json!([["_C", "cu130/aarch64", "module"]]),
        "{report}"
    );
}
