//! `wheel verify` names a bundle whose recorded compiler flags the JIT would refuse (case 2 of
//! the hardening list): the default library's wheel with its index edited, as an attacker
//! (or a manifest with `-Xcompiler`) would leave it, RECORD and kernels.idx rewritten to match
//! so that only the bundle check can see it.

use super::*;

/// The built wheel with every kernel's recorded inputs changed by `edit`; RECORD and
/// kernels.idx rewritten to agree with the new index.
fn wheel_with_index(dir: &Path, original: &[u8], edit: impl Fn(&mut prebuilt::Index)) -> PathBuf {
    let mut index = wheel_index(original);
    let original = entries(original);
    edit(&mut index);
    let record_name = original
        .iter()
        .map(|(name, _)| name.clone())
        .find(|name| name.ends_with("RECORD"))
        .unwrap();
    let files: Vec<(String, Vec<u8>)> = original
        .iter()
        .filter(|(name, _)| *name != record_name)
        .map(|(name, data)| match name.as_str() {
            "af3_kernels/_prebuilt/kernels.idx" => (name.clone(), prebuilt::lookup::encode(&index)),
            _ => (name.clone(), data.clone()),
        })
        .collect();
    let path = dir.join(WHEEL_NAME);
    write_with_record(&path, &files, &record_name);
    path
}

#[test]
fn case_2_wheel_verify_names_flags_the_jit_refuses() {
    let Some(shared) = shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The wheel ships kernels.idx only: what refers to the index names it.
    let index_name = "af3_kernels/_prebuilt/kernels.idx";

    // Flags on the allowlist verify.
    let allowed = wheel_with_index(dir.path(), &shared.bytes, |index| {
        for record in index.kernels.values_mut() {
            record.inputs.nvcc_flags = vec!["-lineinfo".into(), "-Xptxas".into(), "-v".into()];
        }
    });
    let report = verify_wheel(&allowed).unwrap();
    assert!(report.is_ok(), "{report}");

    let hostile = dir.path().join("hostile");
    std::fs::create_dir_all(&hostile).unwrap();
    let hostile = wheel_with_index(&hostile, &shared.bytes, |index| {
        let record = index.kernels.get_mut("layernorm_bf16").unwrap();
        record.inputs.nvcc_flags = vec!["-MD".into(), "-MF".into(), "/tmp/x/pwned".into()];
        record
            .inputs
            .flags
            .push("--compiler-bindir=/tmp/evil".into());
        record
            .inputs
            .defines
            .insert("X".into(), "$(touch /tmp/pwned)".into());
    });
    let report = verify_wheel(&hostile).unwrap();
    let about = problems_about(&report, index_name);
    assert_eq!(about.len(), 3, "{report}");
    for (message, refused) in about.iter().zip([
        "flags holds `--compiler-bindir=/tmp/evil`",
        "nvcc_flags holds `-MD`",
        "defines holds `-DX=$(touch /tmp/pwned)`",
    ]) {
        assert!(
            message.starts_with("kernel `layernorm_bf16`: its ")
                && message.contains(refused)
                && message.contains("the JIT fallback refuses to compile it"),
            "{message}"
        );
    }
    assert_eq!(
        report.problems.len(),
        3,
        "only the index is wrong: {report}"
    );
}
