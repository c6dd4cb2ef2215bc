//! The loader's reads of one stored file and its frame, in as few system calls and
//! allocations as a first load can take: a file opened once where no link leads out of the
//! bundle and read whole at its size, a frame's prefix (family dictionary or reference cubin)
//! found where the index's format says it most likely is, and frames decoded on one kept
//! context per thread.

use super::*;

/// Reads the regular file at `relative` under `root`, at most `cap` bytes: what
/// [`resolve_inside`] then [`read_regular_file`] do, with their errors, in fewer system calls
/// (a first load reads two files): [`open_inside`], then one read of exactly the size `fstat`
/// gave into a buffer of that size.
pub fn read_inside(
    root: &Path,
    relative: &ArtifactPath,
    cap: u64,
) -> Result<(PathBuf, Vec<u8>), BundleError> {
    use std::io::Read as _;
    let (path, file, size) = open_inside(root, relative)?;
    let read_error = |source| BundleError::Read {
        path: path.clone(),
        source,
    };
    if size > cap {
        return Err(read_error(refusal(
            std::io::ErrorKind::InvalidData,
            format!("{size} bytes, over the {cap}-byte cap"),
        )));
    }
    // `size` is at most `cap`; a file that grew since is read no further than its size.
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(size)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    Ok((path, bytes))
}

/// Reads the prefix with raw-content sha256 `digest` (a family dictionary or a reference
/// cubin's artifact, [`prefix_path`]; a plain zstd frame) and decompresses it; with `verify`,
/// checks its sha256 too. The loader does not: a frame decompressed against other bytes fails
/// its checksum or the cubin's own sha256, which is always checked before a load, so hashing
/// the prefix would only name the file in the error.
pub fn read_prefix(
    root: &Path,
    digest: &str,
    verify_digest: bool,
    kernel: &str,
    variant: &str,
) -> Result<Vec<u8>, BundleError> {
    read_prefix_from(root, digest, verify_digest, false, kernel, variant)
}

/// [`read_prefix`], looking for the reference cubin's artifact before a dictionary file when
/// `artifact_first` (an index of [`REFERENCE_INDEX_FORMAT`](crate::index::REFERENCE_INDEX_FORMAT),
/// whose prefixes are mostly shipped cubins): both are one plain frame of the bytes with that
/// digest, so the order only saves a lookup of a file that is not there.
pub(crate) fn read_prefix_from(
    root: &Path,
    digest: &str,
    verify_digest: bool,
    artifact_first: bool,
    kernel: &str,
    variant: &str,
) -> Result<Vec<u8>, BundleError> {
    let index = root.join(INDEX_FILE);
    let refused = |source| BundleError::Refused {
        path: index.clone(),
        source,
    };
    Digest::parse(digest)
        .map_err(|e| refused(e.of(format!("the dictionary of `{kernel}` ({variant})"))))?;
    // A dictionary is capped lower than a cubin; a reference cubin is one. Each candidate is
    // read where it is (no `stat` to look first): the first that is there, as `prefix_path`.
    let dictionary = (
        ArtifactPath::parse(&dictionary_path(digest)).map_err(refused)?,
        MAX_DICTIONARY_SIZE,
    );
    let artifact = (
        ArtifactPath::parse(&artifact_path(digest)).map_err(refused)?,
        MAX_ARTIFACT_SIZE,
    );
    let (first, second) = if artifact_first {
        (&artifact, &dictionary)
    } else {
        (&dictionary, &artifact)
    };
    let absent = |read: &Result<_, BundleError>| {
        matches!(read, Err(BundleError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound)
    };
    let mut read = read_inside(root, &first.0, first.1);
    if absent(&read) {
        read = match read_inside(root, &second.0, second.1) {
            // Neither is there: named as the dictionary, as before.
            Err(BundleError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Err(BundleError::Read {
                    path: dictionary.0.join_to(root),
                    source,
                })
            }
            other => other,
        };
    }
    let (path, stored) = read?;
    let cap = if path.starts_with(root.join(ARTIFACTS_DIR)) {
        MAX_ARTIFACT_SIZE
    } else {
        MAX_DICTIONARY_SIZE
    };
    let corrupt = |source| BundleError::Corrupt {
        kernel: kernel.to_owned(),
        variant: format!("{variant} dictionary"),
        path: path.clone(),
        source,
    };
    let bytes = decompress_with_prefix(&stored, &[], cap).map_err(corrupt)?;
    if verify_digest {
        let actual = sha256_hex(&bytes);
        if actual != digest {
            return Err(BundleError::DigestMismatch {
                kernel: kernel.to_owned(),
                variant: format!("{variant} dictionary"),
                path,
                expected: digest.to_owned(),
                actual,
            });
        }
    }
    Ok(bytes)
}

/// Opens the regular file at `relative` under `root` and gives its path and size, refused as
/// [`resolve_inside`] and [`open_regular_file`](crate::untrusted::open_regular_file) refuse
/// (a link leading out first). Where no symbolic link is on the whole path, that is one
/// `openat2` that follows none and one `fstat` ([`open_without_links`]); else one `stat`, an
/// `open` that does not wait on a FIFO, `fstat` and the opened file's own path from
/// `/proc/self/fd`: the file opened must lie inside the root. That is checked on the file
/// opened, not on the path again, which a link swapped in between could send elsewhere; only
/// where `/proc` cannot tell, [`resolve_inside`] decides.
pub(crate) fn open_inside(
    root: &Path,
    relative: &ArtifactPath,
) -> Result<(PathBuf, std::fs::File, u64), BundleError> {
    let path = relative.join_to(root);
    if let Some((file, size)) = open_without_links(&path) {
        return Ok((path, file, size));
    }
    let read_error = |source| BundleError::Read {
        path: path.clone(),
        source,
    };
    // A link leading out is the refusal whatever else is wrong with the file, as before.
    let inside = || resolve_inside(root, relative).map(drop).map_err(read_error);
    let not_regular = || refusal(std::io::ErrorKind::InvalidInput, "not a regular file");
    let opened = std::fs::metadata(&path).and_then(|metadata| {
        if !metadata.is_file() {
            return Err(not_regular());
        }
        let file = open_without_waiting(&path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(not_regular());
        }
        Ok((file, metadata.len()))
    });
    let (file, size) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            inside()?;
            return Err(read_error(error));
        }
    };
    match opened_path(&file) {
        Some(opened) if opened == path => {}
        Some(opened) => {
            crate::untrusted::check_resolved_inside(root, &opened).map_err(read_error)?;
        }
        None => inside()?,
    }
    Ok((path, file, size))
}

/// Opens `path` for reading without waiting for a FIFO's writer (a FIFO swapped in after the
/// `stat` is then refused by the `fstat` that follows).
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
        options.custom_flags(flags.bits() as i32);
    }
    options.open(path)
}

/// The regular file at `path` and its size, opened by an `openat2` that refuses every
/// symbolic link on the way (so a path joined from a bundle root and a checked relative path
/// stays inside the root) and does not wait on a FIFO, then checked by `fstat`. `None` for
/// anything else (a link on the way, a file that is not there or not regular, a kernel
/// without `openat2`): [`open_inside`]'s full checks then decide, and name the refusal.
fn open_without_links(path: &Path) -> Option<(std::fs::File, u64)> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd =
            rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS).ok()?;
        let file = std::fs::File::from(fd);
        let metadata = file.metadata().ok()?;
        metadata.is_file().then_some((file, metadata.len()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// The path `file` was opened at as the kernel names it (`/proc/self/fd`): absolute, every
/// link resolved. `None` where that cannot be told.
fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// The first bytes of a zstd dictionary (`ZSTD_MAGIC_DICTIONARY`).
pub(super) const ZSTD_DICTIONARY_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();

/// A fresh decompression context whose window may reach `2^29` bytes.
pub(super) fn new_context() -> std::io::Result<zstd::zstd_safe::DCtx<'static>> {
    use zstd::zstd_safe::{self, DParameter};
    let mut context = zstd_safe::DCtx::create();
    // The writer's window reaches from a cubin back over its prefix, each at most
    // MAX_ARTIFACT_SIZE, so 2^29 covers every frame it writes.
    context
        .set_parameter(DParameter::WindowLogMax(29))
        .map_err(|code| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                zstd_safe::get_error_name(code),
            )
        })?;
    Ok(context)
}

/// Runs `body` with this thread's decompression context, made on first use and kept:
/// creating one costs more than decoding a small cubin.
pub(super) fn with_kept_context<T>(
    body: impl FnOnce(&mut zstd::zstd_safe::DCtx<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<zstd::zstd_safe::DCtx<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    CONTEXT.with(|cell| {
        let mut cell = cell.borrow_mut();
        let context = match &mut *cell {
            Some(context) => context,
            empty => empty.insert(new_context()?),
        };
        body(context)
    })
}

/// [`decompress_bounded`]'s common case in one call on the thread's kept context (a stream
/// decoder of its own costs more than a small cubin's decode): a first frame that declares a
/// content size within `size`, decoded whole to exactly that. `None` for anything else, which
/// the stream decoder then decodes, or refuses, as it always did.
pub(super) fn decompress_declared(
    compressed: &[u8],
    dictionary: Option<&[u8]>,
    size: u64,
) -> Option<Vec<u8>> {
    use zstd::zstd_safe;
    let declared = zstd_safe::get_frame_content_size(compressed).ok()??;
    if declared > size.min(MAX_ARTIFACT_SIZE) {
        return None;
    }
    // The first frame alone, as the stream decoder's `single_frame` reads it.
    let frame = compressed.get(..zstd_safe::find_frame_compressed_size(compressed).ok()?)?;
    let mut bytes = Vec::with_capacity(declared as usize);
    let decoded = with_kept_context(|context| {
        // A trained dictionary is loaded as one, raw content as a prefix, as the stream
        // decoder's `with_dictionary` does; an empty one is none.
        context
            .decompress_using_dict(&mut bytes, frame, dictionary.unwrap_or_default())
            .map_err(|_| std::io::ErrorKind::InvalidData.into())
    })
    .ok()?;
    (decoded as u64 == declared).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-call open takes a plain regular file only; a link anywhere on the path (the
    /// root's own included), a FIFO or a folder go to the full checks, which follow a link
    /// that stays inside, refuse one that leads out, and never block on a FIFO.
    #[test]
    fn files_behind_links_or_not_regular_get_the_full_checks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bundle");
        std::fs::create_dir_all(root.join("artifacts")).unwrap();
        std::fs::write(root.join("artifacts/plain"), b"cubin").unwrap();
        let plain = ArtifactPath::parse("artifacts/plain").unwrap();
        assert_eq!(open_without_links(&plain.join_to(&root)).unwrap().1, 5);
        assert_eq!(open_inside(&root, &plain).unwrap().2, 5);

        // The root reached through a link: the full checks read it.
        std::os::unix::fs::symlink(&root, dir.path().join("linked")).unwrap();
        let linked = dir.path().join("linked");
        assert!(open_without_links(&plain.join_to(&linked)).is_none());
        assert_eq!(open_inside(&linked, &plain).unwrap().2, 5);

        // A link inside that stays inside is followed; one that leads out is refused.
        std::os::unix::fs::symlink("plain", root.join("artifacts/inside")).unwrap();
        let inside = ArtifactPath::parse("artifacts/inside").unwrap();
        assert!(open_without_links(&inside.join_to(&root)).is_none());
        assert_eq!(open_inside(&root, &inside).unwrap().2, 5);
        let outside = dir.path().join("outside");
        std::fs::write(&outside, b"not the bundle's").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("artifacts/out")).unwrap();
        let out = ArtifactPath::parse("artifacts/out").unwrap();
        let message = crate::error_chain(&open_inside(&root, &out).unwrap_err());
        assert!(message.contains("leads out of the bundle"), "{message}");

        // A FIFO is opened without waiting for a writer, and refused; so is a folder.
        let status = std::process::Command::new("mkfifo")
            .arg(root.join("artifacts/fifo"))
            .status()
            .unwrap();
        assert!(status.success());
        let fifo = ArtifactPath::parse("artifacts/fifo").unwrap();
        assert!(open_without_links(&fifo.join_to(&root)).is_none());
        let message = crate::error_chain(&open_inside(&root, &fifo).unwrap_err());
        assert!(message.contains("not a regular file"), "{message}");
        std::fs::create_dir(root.join("artifacts/folder")).unwrap();
        let folder = ArtifactPath::parse("artifacts/folder").unwrap();
        assert!(open_without_links(&folder.join_to(&root)).is_none());
        let message = crate::error_chain(&open_inside(&root, &folder).unwrap_err());
        assert!(message.contains("not a regular file"), "{message}");
    }
}
