//! The zip end records and central directory as `wheel verify` reads them: the end record,
//! the zip64 locator and record, the directory walk, extra fields, local headers, data
//! descriptors and the coverage of the bytes before the directory, without a zip reader.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(names) = release::verify::zip_entry_names(data) {
        // What passes is one reading: the names are what the records say, each once read.
        assert!(names.len() <= data.len() / 46);
    }
});
