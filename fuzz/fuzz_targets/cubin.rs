//! Cubin inspection: the ELF header, symbols and `.nv.info` parameter records.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = prebuilt::cubin::is_cubin(data);
    let _ = prebuilt::cubin::inspect_cubin(data);
});
