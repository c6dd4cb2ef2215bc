//! A shard directory's `shard.json`, as `merge-bundles` reads it.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = bundler::shard::check_shard_file(Path::new("shard"), data);
});
