//! `wheel verify` on a whole wheel: the zip (central directory, zip64, extra fields), RECORD,
//! METADATA, WHEEL, any `_prebuilt/` bundle inside, and the audit of its ELF files.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let name =
        Path::new("af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl");
    let report = release::verify::verify_wheel_bytes(name, data);
    let _ = report.to_string();
});
