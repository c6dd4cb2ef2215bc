//! Where an open `kernels.idx`'s bytes are: the file itself, read at offsets, or bytes already
//! read (a wheel's entry).

use std::fs::File;
use std::os::unix::fs::FileExt as _;

/// Where the file's bytes are: the file itself, or bytes already read (a wheel's entry).
#[derive(Debug)]
pub(super) enum Data {
    File(File),
    Bytes(Vec<u8>),
}

impl Data {
    pub(super) fn read_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Data::File(file) => file.read_exact_at(buffer, offset),
            Data::Bytes(bytes) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                let span = start
                    .checked_add(buffer.len())
                    .and_then(|end| bytes.get(start..end))
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buffer.copy_from_slice(span);
                Ok(())
            }
        }
    }

    pub(super) fn len(&self) -> std::io::Result<u64> {
        match self {
            Data::File(file) => Ok(file.metadata()?.len()),
            Data::Bytes(bytes) => Ok(bytes.len() as u64),
        }
    }
}
