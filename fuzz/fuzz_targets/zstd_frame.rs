//! One artifact's zstd frame, decompressed with the bundle's trained dictionary and, as a
//! family frame, against the same bytes as its raw-content prefix; both bounded by the recorded
//! size. Input: `[u16 LE dictionary length][u32 LE recorded size][dictionary][frame]`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prebuilt::untrusted::MAX_ARTIFACT_SIZE;

fuzz_target!(|data: &[u8]| {
    let Some((header, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let dictionary_len = usize::from(u16::from_le_bytes([header[0], header[1]]));
    let size = u64::from(u32::from_le_bytes([
        header[2], header[3], header[4], header[5],
    ]));
    let Some((dictionary, frame)) = rest.split_at_checked(dictionary_len) else {
        return;
    };
    if let Ok(bytes) = prebuilt::bundle::decompress_with_prefix(frame, dictionary, size) {
        assert!(bytes.len() as u64 <= size.min(MAX_ARTIFACT_SIZE));
    }
    let dictionary = (!dictionary.is_empty()).then_some(dictionary);
    if let Ok(bytes) = prebuilt::bundle::decompress_bounded(frame, dictionary, size) {
        assert!(bytes.len() as u64 <= size.min(MAX_ARTIFACT_SIZE) + 1);
    }
});
