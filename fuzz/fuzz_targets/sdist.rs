//! An sdist's `.tar.gz` as `wheel verify` reads it: one gzip member, tar headers, PAX records,
//! GNU long names, entry kinds, the caps on sizes and ratio, and the end-of-archive padding.
//! File contents are streamed to a sink, as verification streams them to its scratch folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut streamed = 0u64;
    let result = release::sdist::read_archive(data, &mut |_, reader| {
        streamed += std::io::copy(reader, &mut std::io::sink())?;
        Ok(())
    });
    if let Ok(entries) = result {
        let declared: u64 = entries
            .iter()
            .map(|entry| match entry.kind {
                release::sdist::EntryKind::File { size, .. } => size,
                release::sdist::EntryKind::Directory => 0,
            })
            .sum();
        assert_eq!(declared, streamed, "every file's bytes, exactly");
    }
});
