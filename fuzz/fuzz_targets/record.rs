//! A wheel's `RECORD` as `wheel verify` parses it: CSV rows of path, hash and size, blank lines
//! skipped, each error naming its line. The work is one pass over the text (each row's line
//! is counted on from the previous row's), so a long RECORD is no slower per byte than a short
//! one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use release::wheel::{parse_record, record_text};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_record(text) {
        Ok(rows) => {
            // What parses is rows kwheel can write again and read back the same.
            assert!(rows.len() <= text.len());
            assert_eq!(parse_record(&record_text(&rows)).as_ref(), Ok(&rows));
        }
        Err(message) => {
            // An error names a line of the text, or none.
            if let Some(line) = message
                .strip_prefix("line ")
                .and_then(|rest| rest.split(':').next())
                .and_then(|number| number.parse::<usize>().ok())
            {
                assert!(line >= 1 && line <= text.matches('\n').count() + 1, "{message}");
            }
        }
    }
});
