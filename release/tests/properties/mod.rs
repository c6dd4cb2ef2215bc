//! Property tests of the wheel's round trips: RECORD rows rendered and parsed back, and wheel
//! file names written and parsed back. Cases are bounded (64 each) to keep CI time flat.

use proptest::prelude::*;
use release::wheel::{parse_record, record_hash, record_text, RecordEntry};
use release::WheelFilename;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    }
}

prop_compose! {
    fn record_entry()(
        // Commas, quotes and spaces need CSV quoting; the writer quotes them.
        path in "[a-z0-9_]{1,8}(/[a-zA-Z0-9_., \"-]{1,12}){0,3}",
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) -> RecordEntry {
        RecordEntry {
            path,
            hash: record_hash(&bytes),
            size: bytes.len().to_string(),
        }
    }
}

prop_compose! {
    fn wheel_filename()(
        name in "[A-Za-z][A-Za-z0-9]{0,6}([._-][A-Za-z0-9]{1,4}){0,2}",
        version in "[0-9]{1,3}(\\.[0-9]{1,3}){0,3}",
        python in prop::sample::select(vec!["py3", "py2.py3", "cp39", "cp311"]),
        abi in prop::sample::select(vec!["none", "abi3"]),
        platform in prop::sample::select(vec![
            "any",
            "manylinux_2_28_x86_64",
            "manylinux_2_28_x86_64.manylinux_2_28_aarch64",
        ]),
    ) -> (String, String, &'static str, &'static str, &'static str) {
        (name, version, python, abi, platform)
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn record_rows_parse_back_to_themselves(
        mut rows in prop::collection::vec(record_entry(), 0..8),
    ) {
        rows.push(RecordEntry {
            path: "demo-1.0.dist-info/RECORD".to_owned(),
            hash: String::new(),
            size: String::new(),
        });
        let text = record_text(&rows);
        prop_assert_eq!(text.matches('\n').count(), rows.len());
        prop_assert_eq!(parse_record(&text).unwrap(), rows);
    }

    #[test]
    fn wheel_file_names_parse_back_and_normalize_once(
        (name, version, python, abi, platform) in wheel_filename(),
    ) {
        let written = WheelFilename::new(&name, &version, python, abi, platform).unwrap();
        let text = written.to_string();
        let parsed = WheelFilename::parse(&text).unwrap();
        prop_assert_eq!(&parsed, &written);
        prop_assert_eq!(parsed.to_string(), text.clone());
        // A parsed name is normal already: writing it again changes nothing.
        let again = WheelFilename::parse(&parsed.to_string()).unwrap();
        prop_assert_eq!(again, parsed);
        let tags = written.tags();
        prop_assert_eq!(
            tags.len(),
            python.split('.').count() * platform.split('.').count()
        );
        prop_assert!(text.ends_with(".whl"));
    }
}
