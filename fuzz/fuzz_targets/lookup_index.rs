//! A bundle's `kernels.idx` read whole, as `bundle list`, `wheel verify` and a slim wheel's
//! tools read it ([`Lookup::index`]): what it accepts passes `index.json`'s checks and is the
//! index it came from (written again, it reads back the same), and what it decodes stays
//! within the cap on a whole index in memory (libFuzzer's `-rss_limit_mb` says so), however
//! many kernels name one graph.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use prebuilt::lookup::{encode, Lookup};
use prebuilt::untrusted::check_index;

fuzz_target!(|data: &[u8]| {
    let Ok(lookup) = Lookup::from_bytes(Path::new("kernels.idx"), data.to_vec()) else {
        return;
    };
    let Ok(index) = lookup.index() else {
        return;
    };
    assert!(check_index(&index).is_ok(), "accepted an index that fails its checks");
    // Compared as written (a NaN constant is not equal to itself, its bits are).
    let written = encode(&index);
    let again = Lookup::from_bytes(Path::new("kernels.idx"), written.clone())
        .and_then(|lookup| lookup.index())
        .expect("an accepted index, written again, reads back");
    assert!(encode(&again) == written, "the whole index read is lossless");
});
