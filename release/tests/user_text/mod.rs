//! Snapshots of what a user reads in a wheel: RECORD, METADATA and WHEEL of a small wheel, the
//! default library's RECORD, and the errors of wheel file names (the default wheel's METADATA,
//! WHEEL and the refusal of a stale bundle are snapshots of the `wheel` area). Digests and
//! sizes that change with every build are filtered.
//!
//! After a deliberate change: `INSTA_UPDATE=always cargo test --release -p release --test run
//! user_text` rewrites the `.snap` files, to be reviewed in the diff.

use super::*;

use crate::writer::small_spec;

/// The kit's filters and RECORD's size column; snapshots named without their module.
pub(crate) fn snapshot_settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in testkit::snapshot_filters() {
        settings.add_filter(&pattern, replacement);
    }
    // RECORD's size column, and the digest prefix of an artifact's folder.
    settings.add_filter(r"(?m),\d+$", ",[SIZE]");
    settings.add_filter(
        r"artifacts/[0-9a-f]{2}/\[SHA256\]",
        "artifacts/[PREFIX]/[SHA256]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings
}

#[test]
fn a_small_wheel_s_record_metadata_and_wheel_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = release::write_wheel(&small_spec(
        dir.path(),
        "any",
        vec![
            WheelFile::from_bytes("demo_kernels/__init__.py", "print('hi')\n"),
            WheelFile::from_bytes("demo_kernels/a,b \"q\".txt", "quoted\n"),
        ],
    ))
    .unwrap();
    let bytes = std::fs::read(path).unwrap();
    // This wheel's bytes are fixed: its digests stay in the snapshot.
    let dist_info = "demo_kernels-1.2.0.dist-info";
    insta::with_settings!({ prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!("small_record", entry(&bytes, &format!("{dist_info}/RECORD")));
    });
    let settings = snapshot_settings();
    settings.bind(|| {
        insta::assert_snapshot!(
            "small_metadata",
            entry(&bytes, &format!("{dist_info}/METADATA"))
        );
        insta::assert_snapshot!("small_wheel", entry(&bytes, &format!("{dist_info}/WHEEL")));
    });
}

#[test]
fn the_default_library_wheel_s_record() {
    let Some(shared) = shared() else { return };
    let settings = snapshot_settings();
    settings.bind(|| {
        insta::assert_snapshot!(
            "default_record",
            entry(&shared.bytes, &format!("{DIST_INFO}/RECORD"))
        );
    });
}

#[test]
fn wheel_file_name_errors() {
    let text: String = [
        "demo-1.0-py3-none.whl",
        "demo-1.0-py3-none-any.zip",
        "demo-1.0-x-py3-none-any.whl",
    ]
    .iter()
    .map(|bad| format!("{bad}: {}\n", WheelFilename::parse(bad).unwrap_err()))
    .collect();
    snapshot_settings().bind(|| insta::assert_snapshot!("wheel_filename_errors", text));
}
