//! The bytes checked are the bytes used: `wheel verify`, `release diff` and `release check
//! --against` work from one reading of a wheel. The swap tests replace the wheel on disk
//! between its check and its use (the `after_check` seam) with a hostile one whose
//! `_prebuilt/` names climb out with `..` or are absolute, and show that nothing is written
//! outside the command's own folder and that what is used is what was verified.

use prebuilt::untrusted::Unreadable;
use release::diff::{diff_releases, Release};
use release::verify::{after_check, AfterCheck, VerifiedWheel};

use super::*;

/// `_prebuilt/` names that lead out of any folder they are joined to, into `outside`: one
/// climbing with `..` past the root, one absolute.
fn escaping_names(outside: &Path) -> Vec<String> {
    let climbing = climbing_out_into(outside);
    let absolute = outside.join("absolute").display().to_string();
    vec![
        format!("af3_kernels/_prebuilt/{climbing}"),
        format!("af3_kernels/_prebuilt/{absolute}"),
    ]
}

/// A copy of the default library's wheel in `dir` (under its own file name), and the hostile
/// wheel prepared to replace it: the escaping names first, then every entry of the wheel.
fn wheel_and_hostile(shared: &Shared, dir: &Path, outside: &Path) -> (PathBuf, PathBuf) {
    let wheel = dir.join(shared.built.path.file_name().unwrap());
    std::fs::write(&wheel, &shared.bytes).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = escaping_names(outside)
        .into_iter()
        .map(|name| (name, b"written outside the scratch folder".to_vec()))
        .collect();
    files.extend(entries(&shared.bytes));
    let hostile = dir.join("hostile.whl");
    write_entries(&hostile, &files);
    (wheel, hostile)
}

/// Moves `hostile` over `wheel` right after `wheel` is checked, once.
fn swap_after_check(wheel: &Path, hostile: &Path) -> AfterCheck {
    let (wheel, hostile) = (wheel.to_owned(), hostile.to_owned());
    after_check(move |checked| {
        if checked == wheel && hostile.exists() {
            std::fs::rename(&hostile, &wheel).unwrap();
        }
    })
}

/// Everything under `dir`, as paths relative to it.
fn listing(dir: &Path) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .map(|entry| {
            let entry = entry.unwrap();
            entry
                .path()
                .strip_prefix(dir)
                .unwrap()
                .display()
                .to_string()
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The swap happened: the wheel on disk is now the hostile one, which the hostile names show.
fn assert_swapped(wheel: &Path) {
    let names: Vec<String> = entries(&std::fs::read(wheel).unwrap())
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert!(
        names.iter().any(|name| name.contains("/../")),
        "the wheel was not replaced"
    );
}

#[test]
fn release_diff_of_a_wheel_swapped_after_its_check_writes_nothing_outside() {
    let Some(shared) = shared() else { return };
    let root = scratch("one-reading-diff");
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let (wheel, hostile) = wheel_and_hostile(shared, &root, &outside);

    let hook = swap_after_check(&wheel, &hostile);
    let opened = Release::open(&wheel);
    drop(hook);
    assert_swapped(&wheel);
    assert_eq!(listing(&outside), Vec::<String>::new(), "written outside");
    // The release is the wheel that was verified: the bundle it was built from, unchanged.
    let old = opened.unwrap_or_else(|error| panic!("{}", chain(&error)));
    let diff = diff_releases(&old, &Release::open(&shared.bundle).unwrap(), None).unwrap();
    assert_eq!(diff.changed().count(), 0, "{diff}");
    assert_eq!(diff.rows.len(), 50, "{diff}");

    // Opened again, the hostile wheel itself is refused for its names, and writes nothing.
    let error = chain(&Release::open(&wheel).err().unwrap());
    assert!(error.contains("failed verification"), "{error}");
    assert!(error.contains("the path has a `..` component"), "{error}");
    assert_eq!(listing(&outside), Vec::<String>::new(), "written outside");
}

#[test]
fn release_check_against_a_wheel_swapped_after_its_check_writes_nothing_outside() {
    let Some(shared) = shared() else { return };
    let root = scratch("one-reading-against");
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let (wheel, hostile) = wheel_and_hostile(shared, &root, &outside);
    let manifest = bundler::Manifest::load(&default_manifest()).unwrap();

    let hook = swap_after_check(&wheel, &hostile);
    let gate = release::check::against_gate(&manifest, &wheel, &shared.bundle);
    drop(hook);
    assert_swapped(&wheel);
    assert_eq!(listing(&outside), Vec::<String>::new(), "written outside");
    assert_eq!(gate.status, release::check::GateStatus::Pass, "{gate:?}");
    assert!(
        gate.reason.starts_with("0 of 50 kernel targets changed"),
        "{}",
        gate.reason
    );
}

/// A small wheel of `files` (`demo-1.0`), with a RECORD that matches them.
fn small_wheel(path: &Path, files: &[(&str, &[u8])]) {
    let mut all: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(name, bytes)| ((*name).to_owned(), bytes.to_vec()))
        .collect();
    all.push((
        "demo-1.0.dist-info/METADATA".to_owned(),
        b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n".to_vec(),
    ));
    all.push((
        "demo-1.0.dist-info/WHEEL".to_owned(),
        b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
    ));
    write_with_record(path, &all, "demo-1.0.dist-info/RECORD");
}

/// Without a toolchain: what a verified reading holds, and extracts, is the wheel as it was
/// checked, whatever replaced it on disk after.
#[test]
fn a_verified_wheel_holds_the_bytes_it_checked_whatever_replaces_the_file() {
    let root = scratch("one-reading-small");
    let wheel = root.join("demo-1.0-py3-none-any.whl");
    small_wheel(&wheel, &[("demo/_prebuilt/a.txt", b"checked")]);
    let hostile = root.join("hostile.whl");
    write_entries(
        &hostile,
        &[
            (
                "demo/_prebuilt/../../escaped".to_owned(),
                b"unchecked".to_vec(),
            ),
            ("demo/_prebuilt/a.txt".to_owned(), b"unchecked".to_vec()),
        ],
    );

    let hook = swap_after_check(&wheel, &hostile);
    let verified = VerifiedWheel::open(&wheel).unwrap();
    drop(hook);
    assert!(!hostile.exists(), "the wheel was replaced");
    assert!(verified.report().is_ok(), "{}", verified.report());
    assert_eq!(verified.files()["demo/_prebuilt/a.txt"], b"checked");
    let into = root.join("into");
    std::fs::create_dir_all(&into).unwrap();
    assert_eq!(verified.extract("demo/_prebuilt/", &into).unwrap(), 1);
    assert_eq!(listing(&into), ["a.txt"]);
    assert_eq!(std::fs::read(into.join("a.txt")).unwrap(), b"checked");
    assert_eq!(
        listing(&root),
        ["demo-1.0-py3-none-any.whl", "into", "into/a.txt"]
    );
    assert!(!root.parent().unwrap().join("escaped").exists());
}

#[test]
fn a_wheel_that_is_a_link_or_a_fifo_is_refused_without_being_read() {
    let root = scratch("one-reading-kinds");
    let real = root.join("real").join("demo-1.0-py3-none-any.whl");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    small_wheel(&real, &[("demo/a.txt", b"a")]);
    assert!(verify_wheel(&real).unwrap().is_ok());

    let link = root.join("demo-1.0-py3-none-any.whl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let fifo = root.join("fifo").join("demo-1.0-py3-none-any.whl");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for (path, expected) in [
        (&link, "a symbolic link; give the wheel file itself"),
        (&fifo, "not a regular file"),
    ] {
        let error = verify_wheel(path).unwrap_err();
        let Error::Read(Unreadable { source, .. }) = &error else {
            panic!("{error:?}");
        };
        assert!(prebuilt::untrusted::is_refusal(source), "{error:?}");
        let message = chain(&error);
        assert!(
            message.contains(&path.display().to_string()) && message.contains(expected),
            "{message}"
        );
    }
}

/// A RECORD of 300,000 short rows naming nothing is refused before it is parsed (it took
/// minutes when every row's line was counted from the start, and its rows and their problems
/// took memory in proportion to its lines, not to the wheel's files).
#[test]
fn a_record_of_300000_short_lines_naming_nothing_is_refused_in_one_pass() {
    let root = scratch("one-reading-record");
    let wheel = root.join("demo-1.0-py3-none-any.whl");
    let record: String = (0..300_000)
        .map(|n| format!("d/{n},,\n"))
        .chain(["demo-1.0.dist-info/RECORD,,\n".to_owned()])
        .collect();
    write_entries(
        &wheel,
        &[
            (
                "demo-1.0.dist-info/METADATA".to_owned(),
                b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n".to_vec(),
            ),
            (
                "demo-1.0.dist-info/WHEEL".to_owned(),
                b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
            ),
            ("demo-1.0.dist-info/RECORD".to_owned(), record.into_bytes()),
        ],
    );
    let report = verify_wheel(&wheel).unwrap();
    assert_eq!(
        problems_about(&report, "demo-1.0.dist-info/RECORD"),
        ["has 300001 lines for the 3 files of the wheel: a RECORD lists each file once"]
    );
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
}
