//! Verification of wheels written by another writer.

use super::*;
use crate::audit::new_glibc_library;

/// Writes a wheel the plain way another tool would: given entries, then a correct RECORD.
fn foreign_wheel(path: &Path, tag: &str, files: &[(&str, &[u8])]) {
    let filename = WheelFilename::parse(&path.file_name().unwrap().to_string_lossy()).unwrap();
    let dist_info = filename.dist_info();
    let mut all: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(n, b)| ((*n).to_owned(), b.to_vec()))
        .collect();
    all.push((
        format!("{dist_info}/METADATA"),
        format!(
            "Metadata-Version: 2.1\nName: {}\nVersion: {}\n",
            filename.name(),
            filename.version()
        )
        .into_bytes(),
    ));
    all.push((
        format!("{dist_info}/WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
            .into_bytes(),
    ));
    let mut record = String::new();
    for (name, bytes) in &all {
        record.push_str(&format!("{name},{},{}\n", record_hash(bytes), bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    all.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let mut writer = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in all {
        writer
            .start_file(name.as_str(), SimpleFileOptions::default())
            .unwrap();
        writer.write_all(&bytes).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn verify_audits_host_elfs_in_any_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let Some(library) = new_glibc_library(dir.path()) else {
        return;
    };
    let path = dir
        .path()
        .join("demo-1.0-cp39-abi3-manylinux_2_28_x86_64.whl");
    foreign_wheel(
        &path,
        "cp39-abi3-manylinux_2_28_x86_64",
        &[
            ("demo/__init__.py", b""),
            ("demo/_native.abi3.so", &library),
        ],
    );
    let report = verify_wheel(&path).unwrap();
    assert_eq!(
        report
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "demo/_native.abi3.so: needs GLIBC_2.34 (from libc.so.6), newer than manylinux_2_28 \
          allows (GLIBC_2.28)"
        ]
    );
    assert_eq!(report.host_elfs, ["demo/_native.abi3.so"]);
}

#[test]
fn verify_checks_tags_against_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join("demo-1.0-py3-none-manylinux_2_28_x86_64.whl");
    foreign_wheel(&path, "py3-none-any", &[("demo/__init__.py", b"")]);
    let report = verify_wheel(&path).unwrap();
    let messages: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "demo-1.0.dist-info/WHEEL: lacks `Tag: py3-none-manylinux_2_28_x86_64`, which the \
             file name has",
            "demo-1.0.dist-info/WHEEL: has `Tag: py3-none-any`, which the file name lacks",
        ]
    );
}

#[test]
fn verify_reports_every_zip_hygiene_problem_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo-1.0-py3-none-any.whl");
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let options = SimpleFileOptions::default();
    for name in [
        "demo/../evil.py",
        "/abs.py",
        "demo/bell\u{7}.py",
        "demo/a.py",
        "demo/b.py",
    ] {
        writer.start_file(name, options).unwrap();
        writer.write_all(b"x = 1\n").unwrap();
    }
    writer.add_directory("demo/dir/", options).unwrap();
    writer
        .add_symlink("demo/link", "/etc/passwd", options)
        .unwrap();
    writer.finish().unwrap();
    // Rename `demo/b.py` to `demo/a.py` in place: a zip writer refuses duplicates.
    let mut bytes = std::fs::read(&path).unwrap();
    let (from, to) = (b"demo/b.py", b"demo/a.py");
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(from.len()).position(|w| w == from) {
        bytes[at + found..at + found + from.len()].copy_from_slice(to);
        at += found + from.len();
    }
    std::fs::write(&path, bytes).unwrap();

    let report = verify_wheel(&path).unwrap();
    let has = |file: &str, text: &str| {
        report
            .problems
            .iter()
            .any(|p| p.file == file && p.message.contains(text))
    };
    assert!(has("demo/../evil.py", "`..` component"), "{report}");
    assert!(has("/abs.py", "absolute"), "{report}");
    assert!(has("demo/bell\u{7}.py", "control character"), "{report}");
    assert!(has("demo/a.py", "appears twice"), "{report}");
    assert!(has("demo/dir/", "directory entry"), "{report}");
    assert!(has("demo/link", "symbolic link"), "{report}");
    assert!(
        has("demo-1.0-py3-none-any.whl", "has no `demo-1.0.dist-info/`"),
        "{report}"
    );
}

#[test]
fn verify_names_files_missing_from_record_and_record_rows_without_files() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("demo-1.0-py3-none-any.whl");
    foreign_wheel(&good, "py3-none-any", &[("demo/__init__.py", b"")]);
    assert!(verify_wheel(&good).unwrap().is_ok());

    // Add a file RECORD does not list, and drop one it does.
    let original = entries(&std::fs::read(&good).unwrap());
    let changed = dir.path().join("changed").join("demo-1.0-py3-none-any.whl");
    std::fs::create_dir_all(changed.parent().unwrap()).unwrap();
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&changed).unwrap());
    for (name, data) in original.iter().filter(|(n, _)| n != "demo/__init__.py") {
        writer
            .start_file(name.as_str(), SimpleFileOptions::default())
            .unwrap();
        writer.write_all(data).unwrap();
    }
    writer
        .start_file("demo/extra.py", SimpleFileOptions::default())
        .unwrap();
    writer.write_all(b"import os\n").unwrap();
    writer.finish().unwrap();
    let report = verify_wheel(&changed).unwrap();
    let messages: BTreeMap<String, String> = report
        .problems
        .iter()
        .map(|p| (p.file.clone(), p.message.clone()))
        .collect();
    assert_eq!(
        messages,
        BTreeMap::from([
            (
                "demo/__init__.py".to_owned(),
                "is listed in RECORD but not in the wheel".to_owned()
            ),
            (
                "demo/extra.py".to_owned(),
                "is not listed in RECORD".to_owned()
            ),
        ])
    );
    assert_eq!(
        report
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["demo/extra.py: comes after `demo-1.0.dist-info/`, which should be last"]
    );
}
