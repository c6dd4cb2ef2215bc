//! The wheel writer on small inputs: file names, byte-identical output, refusals.

use super::*;

pub(crate) fn small_spec(out: &Path, platform: &str, files: Vec<WheelFile>) -> WheelSpec {
    WheelSpec {
        filename: WheelFilename::new("demo-kernels", "1.2.0", "py3", "none", platform).unwrap(),
        metadata: Metadata {
            name: "demo-kernels".into(),
            version: "1.2.0".into(),
            summary: Some("Demo.".into()),
            requires_python: None,
            requires_dist: vec![torch_requirement("2.13.*").unwrap().unwrap()],
        },
        files,
        out_dir: out.to_owned(),
        modified: Some(1_700_000_000),
    }
}

#[test]
fn wheel_file_names_normalize_and_expand_tags() {
    let name = WheelFilename::new("Af3.Kernels__x", "0.1.0-rc1", "py2.py3", "none", "any").unwrap();
    assert_eq!(
        name.to_string(),
        "af3_kernels_x-0.1.0_rc1-py2.py3-none-any.whl"
    );
    assert_eq!(name.tags(), ["py2-none-any", "py3-none-any"]);
    assert_eq!(name.dist_info(), "af3_kernels_x-0.1.0_rc1.dist-info");
    assert!(name.is_purelib());
    let parsed: WheelFilename = "af3_kernels_x-0.1.0_rc1-py2.py3-none-any.whl"
        .parse()
        .unwrap();
    assert_eq!(parsed, name);
    let built = WheelFilename::parse("kwheel-0.1.0-1-cp39-abi3-manylinux_2_28_x86_64.whl").unwrap();
    assert_eq!(built.build(), Some("1"));
    assert_eq!(built.tags(), ["cp39-abi3-manylinux_2_28_x86_64"]);
    assert!(!built.is_purelib());

    for (bad, reason) in [
        ("demo-1.0-py3-none.whl", "five or six"),
        ("demo-1.0-py3-none-any.zip", "does not end in `.whl`"),
        (
            "demo-1.0-x-py3-none-any.whl",
            "build tag does not start with a digit",
        ),
    ] {
        let error = WheelFilename::parse(bad).unwrap_err().to_string();
        assert!(error.contains(reason), "{bad}: {error}");
    }
    assert!(WheelFilename::new("-demo", "1", "py3", "none", "any").is_err());
    assert!(WheelFilename::new("demo", "1 0", "py3", "none", "any").is_err());
    assert!(WheelFilename::new("demo", "1", "py3", "none", "many-linux").is_err());
}

#[test]
fn written_wheels_are_byte_identical_and_dated_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let files = || {
        vec![
            WheelFile::from_bytes("demo_kernels/__init__.py", "print('hi')\n"),
            WheelFile::from_bytes("demo_kernels/a,b \"q\".txt", "quoted\n"),
            WheelFile::from_bytes("demo_kernels/data.zst", vec![0x28, 0xb5, 0x2f, 0xfd]),
            WheelFile {
                executable: true,
                ..WheelFile::from_bytes("demo_kernels/run.sh", "#!/bin/sh\n")
            },
        ]
    };
    let first = release::write_wheel(&small_spec(&dir.path().join("a"), "any", files())).unwrap();
    let second = release::write_wheel(&small_spec(&dir.path().join("b"), "any", files())).unwrap();
    let bytes = std::fs::read(&first).unwrap();
    assert_eq!(bytes, std::fs::read(&second).unwrap());
    assert_eq!(
        first.file_name().unwrap(),
        "demo_kernels-1.2.0-py3-none-any.whl"
    );

    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
    for n in 0..archive.len() {
        let file = archive.by_index(n).unwrap();
        let time = file.last_modified().unwrap();
        // 1_700_000_000 is 2023-11-14T22:13:20Z.
        assert_eq!(
            (
                time.year(),
                time.month(),
                time.day(),
                time.hour(),
                time.minute(),
                time.second()
            ),
            (2023, 11, 14, 22, 13, 20)
        );
        let mode = if file.name().ends_with("run.sh") {
            0o100755
        } else {
            0o100644
        };
        assert_eq!(file.unix_mode(), Some(mode), "{}", file.name());
    }
    let record = entry(&bytes, "demo_kernels-1.2.0.dist-info/RECORD");
    let quoted = "\"demo_kernels/a,b \"\"q\"\".txt\",";
    assert!(record.contains(quoted), "{record}");
    assert!(record.contains(&format!(
        "demo_kernels/__init__.py,{},12\n",
        record_hash(b"print('hi')\n")
    )));
    assert!(entry(&bytes, "demo_kernels-1.2.0.dist-info/WHEEL").contains("Root-Is-Purelib: true\n"));
    let report = verify_wheel(&first).unwrap();
    assert!(report.is_ok(), "{report}");
}

#[test]
fn unusable_paths_and_mismatched_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (path, reason) in [
        ("../evil.py", "`..` component"),
        ("/abs.py", "absolute"),
        ("demo_kernels-1.2.0.dist-info/extra", "is reserved"),
        ("other-1.0.dist-info/METADATA", "is reserved"),
    ] {
        let spec = small_spec(dir.path(), "any", vec![WheelFile::from_bytes(path, "x")]);
        let error = release::write_wheel(&spec).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("cannot put `{path}` into a wheel: "))
                && error.contains(reason),
            "{error}"
        );
    }
    let twice = small_spec(
        dir.path(),
        "any",
        vec![
            WheelFile::from_bytes("a.py", "1"),
            WheelFile::from_bytes("a.py", "2"),
        ],
    );
    assert!(release::write_wheel(&twice)
        .unwrap_err()
        .to_string()
        .contains("two files"));
    let mut renamed = small_spec(dir.path(), "any", vec![WheelFile::from_bytes("a.py", "1")]);
    renamed.metadata.name = "other".into();
    assert!(matches!(
        release::write_wheel(&renamed),
        Err(Error::NameMismatch { .. })
    ));
    let unknown = small_spec(dir.path(), "manylinux_2_17_x86_64", Vec::new());
    assert_eq!(
        release::write_wheel(&unknown).unwrap_err().to_string(),
        "no audit policy for platform tag `manylinux_2_17_x86_64`: kwheel writes wheels tagged \
         `manylinux_2_28_x86_64`, `manylinux_2_28_aarch64`, `linux_*` or `any`"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}
