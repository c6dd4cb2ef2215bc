//! A remote cache's action-cache entry (an `ActionResult` in protobuf JSON).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((digest, _size)) = bundler::remote::parse_action_result(data) {
        assert_eq!(digest.as_str().len(), 64);
    }
});
