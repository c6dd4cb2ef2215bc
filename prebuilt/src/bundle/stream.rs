//! Verifying an artifact without holding it: the frame inflates into a hasher and a sink (a
//! temp file, or nothing), so `wheel verify` and `bundle extract` use the decoder's window of
//! memory, not the cubin's size.

use super::*;
use crate::cache::PendingFile;

/// Decodes a stored artifact under `root` into `sink` as it inflates, hashing on the way, and
/// verifies it against `stored`: [`read_stored`]'s checks, but the cubin is never held whole
/// (`wheel verify`, `bundle extract`). Memory is the decoder's window, which a frame that
/// declares its size never makes larger than that size, within the same caps. `sink` may
/// receive bytes before a mismatch is found: write to a temp file and rename on success.
pub fn stream_stored(
    root: &Path,
    stored: &StoredFile,
    dictionary: FrameDictionary<'_>,
    kernel: &str,
    variant: &str,
    sink: &mut dyn std::io::Write,
) -> Result<(), BundleError> {
    use std::io::{BufRead as _, Read as _};
    use zstd::zstd_safe::{self, DParameter};
    let path = artifact_file(root, stored, kernel, variant)?;
    let read_error = |source| BundleError::Read {
        path: path.clone(),
        source,
    };
    let file = crate::untrusted::open_regular_file(&path).map_err(read_error)?;
    let length = file.metadata().map_err(read_error)?.len();
    if length > MAX_ARTIFACT_SIZE {
        return Err(read_error(crate::untrusted::refusal(
            std::io::ErrorKind::InvalidData,
            format!("{length} bytes, over the {MAX_ARTIFACT_SIZE}-byte cap"),
        )));
    }
    let corrupt = corrupt_artifact(kernel, variant, &path);
    let invalid =
        |what: String| corrupt(std::io::Error::new(std::io::ErrorKind::InvalidData, what));
    let mut file = file.take(MAX_ARTIFACT_SIZE);
    // A frame header is at most 18 bytes: read it first, for the declared size.
    let mut head = Vec::with_capacity(18);
    (&mut file)
        .take(18)
        .read_to_end(&mut head)
        .map_err(read_error)?;
    let declared = zstd_safe::get_frame_content_size(&head).ok().flatten();
    let input = std::io::BufReader::with_capacity(
        zstd_safe::DCtx::in_size(),
        std::io::Cursor::new(head).chain(file),
    );
    let limit = stored.size.min(MAX_ARTIFACT_SIZE);
    let mut decoder = match dictionary {
        FrameDictionary::None => zstd::stream::read::Decoder::with_buffer(input),
        FrameDictionary::Trained(dictionary) => {
            zstd::stream::read::Decoder::with_dictionary(input, dictionary)
        }
        FrameDictionary::Prefix(prefix) => {
            // As decompress_with_prefix: the frame declares its size, at most the recorded one.
            match declared {
                Some(declared) if declared <= limit => {}
                Some(declared) => {
                    return Err(invalid(format!(
                        "the frame declares {declared} bytes, more than the {limit} recorded"
                    )))
                }
                None => return Err(invalid("the frame does not declare its size".to_owned())),
            }
            zstd::stream::read::Decoder::with_ref_prefix(input, prefix).and_then(|mut decoder| {
                decoder.set_parameter(DParameter::WindowLogMax(29))?;
                Ok(decoder)
            })
        }
    }
    .map_err(&corrupt)?
    .single_frame();
    let mut hashing = HashingWriter {
        inner: sink,
        hasher: <sha2::Sha256 as sha2::Digest>::new(),
        written: 0,
    };
    // One byte past the recorded size, as decompress_bounded: longer is a digest mismatch.
    let copied = std::io::copy(&mut (&mut decoder).take(limit + 1), &mut hashing);
    let HashingWriter {
        hasher, written, ..
    } = hashing;
    match copied {
        Ok(_) => {}
        // The sink's own failure (a full disk), not the artifact's.
        Err(source)
            if source
                .get_ref()
                .is_some_and(|inner| inner.is::<SinkFailed>()) =>
        {
            return Err(BundleError::Write {
                path: path.clone(),
                source,
            })
        }
        Err(source) => return Err(corrupt(source)),
    }
    if let FrameDictionary::Prefix(_) = dictionary {
        if declared != Some(written) && written <= limit {
            return Err(invalid(format!(
                "the frame declares {} bytes but holds {written}",
                declared.unwrap_or_default()
            )));
        }
        // decompress_with_prefix decodes the whole file: bytes after the frame fail there.
        if written <= limit && !decoder.finish().fill_buf().map_err(read_error)?.is_empty() {
            return Err(invalid("bytes follow the frame".to_owned()));
        }
    }
    let actual = hex::encode(sha2::Digest::finalize(hasher));
    if actual != stored.digest || written != stored.size {
        return Err(BundleError::DigestMismatch {
            kernel: kernel.to_owned(),
            variant: variant.to_owned(),
            path: path.clone(),
            expected: stored.digest.clone(),
            actual,
        });
    }
    Ok(())
}

/// Passes bytes to `inner`, hashing and counting them; the sink's own errors are marked
/// ([`SinkFailed`]) so that they are not reported as a corrupt artifact.
struct HashingWriter<'w> {
    inner: &'w mut dyn std::io::Write,
    hasher: sha2::Sha256,
    written: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SinkFailed(std::io::Error);

impl std::io::Write for HashingWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self
            .inner
            .write(bytes)
            .map_err(|error| std::io::Error::new(error.kind(), SinkFailed(error)))?;
        sha2::Digest::update(&mut self.hasher, &bytes[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner
            .flush()
            .map_err(|error| std::io::Error::new(error.kind(), SinkFailed(error)))
    }
}

/// Writes `path` from `write` (a decoder streaming into it) through a [`PendingFile`], put
/// in place only when `write` succeeds; on failure nothing is left.
pub(super) fn write_streamed(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> Result<(), BundleError>,
) -> Result<(), BundleError> {
    let write_error = |source| BundleError::Write {
        path: path.to_owned(),
        source,
    };
    let pending = PendingFile::new(path).map_err(write_error)?;
    let mut buffered = std::io::BufWriter::with_capacity(1 << 20, pending.as_file());
    write(&mut buffered)?;
    std::io::Write::flush(&mut buffered).map_err(write_error)?;
    drop(buffered);
    pending.persist().map_err(write_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `content` against `prefix` as the writer makes them (window over both,
    /// checksum and content size on).
    fn frame(content: &[u8], prefix: Option<&[u8]>) -> Vec<u8> {
        use zstd::zstd_safe::{self, CParameter};
        let mut context = zstd_safe::CCtx::create();
        for parameter in [
            CParameter::CompressionLevel(3),
            CParameter::WindowLog(27),
            CParameter::ChecksumFlag(true),
            CParameter::ContentSizeFlag(true),
        ] {
            context.set_parameter(parameter).unwrap();
        }
        if let Some(prefix) = prefix {
            context.ref_prefix(prefix).unwrap();
        }
        let mut out = Vec::with_capacity(zstd_safe::compress_bound(content.len()));
        context.compress2(&mut out, content).unwrap();
        out
    }

    /// `stored_bytes` as the artifact of `content` in a bundle of its own under `dir`.
    fn stored(dir: &Path, content: &[u8], stored_bytes: &[u8]) -> (PathBuf, StoredFile) {
        static BUNDLES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = dir.join(
            BUNDLES
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .to_string(),
        );
        let stored = crate::testing::write_frame(&dir, content, stored_bytes);
        (dir, stored)
    }

    /// Records the largest single write: the decoder hands the cubin over in pieces.
    #[derive(Default)]
    struct Pieces {
        total: u64,
        largest: usize,
    }

    impl std::io::Write for Pieces {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.total += bytes.len() as u64;
            self.largest = self.largest.max(bytes.len());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The outcome of both reads of one stored file: they must agree, and `Ok` must carry the
    /// content in both.
    fn both(
        dir: &Path,
        stored: &StoredFile,
        dictionary: FrameDictionary<'_>,
    ) -> Result<(), String> {
        let whole = read_stored(dir, stored, dictionary, "k", "cu130/sm_90a");
        let mut sink = Vec::new();
        let streamed = stream_stored(dir, stored, dictionary, "k", "cu130/sm_90a", &mut sink);
        match (whole, streamed) {
            (Ok(bytes), Ok(())) => {
                assert_eq!(bytes, sink);
                Ok(())
            }
            (Err(a), Err(b)) => {
                let same_kind = std::mem::discriminant(&a) == std::mem::discriminant(&b);
                assert!(same_kind, "read: {a:?}\nstreamed: {b:?}");
                Err(crate::error_chain(&b))
            }
            (a, b) => panic!("the reads disagree: read {a:?}, streamed {b:?}"),
        }
    }

    #[test]
    fn streamed_verification_accepts_and_refuses_what_the_loader_does() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let content: Vec<u8> = (0..3u32 << 20)
            .map(|n| ((n % 251) ^ (n >> 13)) as u8)
            .collect();
        let prefix: Vec<u8> = content[..1 << 20].iter().rev().copied().collect();
        let dictionary = zstd::dict::from_continuous(&content, &[content.len()], 4096).ok();

        // Plain, trained and prefix frames of the right bytes.
        let plain = stored(root, &content, &frame(&content, None));
        both(&plain.0, &plain.1, FrameDictionary::None).unwrap();
        if let Some(dictionary) = &dictionary {
            let bytes = zstd::bulk::Compressor::with_dictionary(3, dictionary)
                .unwrap()
                .compress(&content)
                .unwrap();
            let trained = stored(root, &content, &bytes);
            both(&trained.0, &trained.1, FrameDictionary::Trained(dictionary)).unwrap();
        }
        let family = stored(root, &content, &frame(&content, Some(&prefix)));
        both(&family.0, &family.1, FrameDictionary::Prefix(&prefix)).unwrap();

        // Other bytes, a size recorded one short, a cut frame, a wrong prefix.
        let mut other_bytes = content.clone();
        other_bytes[12345] ^= 1;
        let other = stored(root, &content, &frame(&other_bytes, None));
        let message = both(&other.0, &other.1, FrameDictionary::None).unwrap_err();
        assert!(message.contains("failed verification"), "{message}");
        let mut short = family.1.clone();
        short.size -= 1;
        let message = both(&family.0, &short, FrameDictionary::Prefix(&prefix)).unwrap_err();
        assert!(message.contains("more than the"), "{message}");
        let mut short = plain.1.clone();
        short.size -= 1;
        both(&plain.0, &short, FrameDictionary::None).unwrap_err();
        let bytes = frame(&content, None);
        let cut = stored(root, &content, &bytes[..bytes.len() / 2]);
        both(&cut.0, &cut.1, FrameDictionary::None).unwrap_err();
        let wrong: Vec<u8> = prefix.iter().map(|b| b ^ 1).collect();
        both(&family.0, &family.1, FrameDictionary::Prefix(&wrong)).unwrap_err();

        // Bytes after a prefix frame fail the loader's whole-file decode, so they fail here.
        let mut trailing = frame(&content, Some(&prefix));
        trailing.extend_from_slice(b"tail");
        let trailing = stored(root, &content, &trailing);
        let message = both(&trailing.0, &trailing.1, FrameDictionary::Prefix(&prefix)).unwrap_err();
        assert!(message.contains("is corrupt"), "{message}");

        // Streamed in pieces, never as one buffer.
        let mut pieces = Pieces::default();
        stream_stored(
            &plain.0,
            &plain.1,
            FrameDictionary::None,
            "k",
            "v",
            &mut pieces,
        )
        .unwrap();
        assert_eq!(pieces.total, content.len() as u64);
        assert!(pieces.largest <= 1 << 20, "{}", pieces.largest);
    }

    /// A stream that fails verification leaves no file where it was written, nor a temp file.
    #[test]
    fn a_streamed_write_that_fails_verification_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let content = vec![5u8; 1 << 20];
        let mut other = content.clone();
        other[0] = 6;
        let (root, record) = stored(dir.path(), &content, &frame(&other, None));
        let out = dir.path().join("out/k/cu130/sm_90a.cubin");
        let error = write_streamed(&out, |file| {
            stream_stored(&root, &record, FrameDictionary::None, "k", "v", file)
        })
        .unwrap_err();
        assert!(
            matches!(error, BundleError::DigestMismatch { .. }),
            "{error}"
        );
        let left: Vec<_> = std::fs::read_dir(out.parent().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
