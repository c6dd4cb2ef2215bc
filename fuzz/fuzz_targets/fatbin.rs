//! An extension module's device code: the `.nv_fatbin` section's containers and entries, each
//! payload inflated within its bounds, and each cubin read for the declared archs; also the
//! in-place clearing of line-table times, which writes inside the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prebuilt::module::fatbin;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = fatbin::fatbin_entries(data) {
        for entry in &entries {
            let _ = entry.payload();
        }
    }
    let archs = ["sm_90a".parse().unwrap(), "compute_90".parse().unwrap()];
    let _ = fatbin::module_device_code(data, &archs);
    let mut copy = data.to_vec();
    let _ = fatbin::clear_line_table_times(&mut copy);
    assert_eq!(copy.len(), data.len());
});
